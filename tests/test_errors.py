"""The one error table: every error class has one REST status and one gRPC code."""
from __future__ import annotations

import grpc
import pytest

from ovserve.server import errors

EXPECTED = [
    (errors.InvalidInput, 400, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound, 404, grpc.StatusCode.NOT_FOUND),
    (errors.Unavailable, 503, grpc.StatusCode.UNAVAILABLE),
    (errors.PayloadTooLarge, 413, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Overloaded, 429, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.FailedPrecondition, 412, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.AlreadyExists, 409, grpc.StatusCode.ALREADY_EXISTS),
    (errors.PermissionDenied, 403, grpc.StatusCode.PERMISSION_DENIED),
    (errors.Unauthenticated, 401, grpc.StatusCode.UNAUTHENTICATED),
    (errors.Unsupported, 501, grpc.StatusCode.UNIMPLEMENTED),
    (errors.DeadlineExceeded, 504, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.InternalError, 500, grpc.StatusCode.INTERNAL),
    (errors.ServerError, 500, grpc.StatusCode.INTERNAL),
]


@pytest.mark.parametrize("klass,http,code", EXPECTED, ids=[e[0].__name__ for e in EXPECTED])
def test_status_pairs(klass, http, code) -> None:
    err = klass("boom")
    assert errors.http_status(err) == http
    assert grpc.StatusCode[errors.grpc_status(err)] is code
    assert str(err) == err.message == "boom"


def test_every_error_class_is_in_the_table() -> None:
    classes = {c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.ServerError)}
    assert classes == set(errors.HTTP_STATUS) == set(errors.GRPC_STATUS) == {e[0] for e in EXPECTED}


def test_subclass_inherits_its_parents_status() -> None:
    class ModelGone(errors.NotFound):
        pass

    assert errors.http_status(ModelGone("x")) == 404
    assert errors.grpc_status(ModelGone("x")) == "NOT_FOUND"


def test_errors_module_imports_no_transport() -> None:
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(errors))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"grpc", "starlette", "uvicorn"}


def test_an_overload_says_when_to_come_back_in_each_transports_form() -> None:
    """Retry-After in whole seconds rounded up, grpc-retry-pushback-ms in milliseconds, a second at least
    (a hint of less would bring the client back to a queue still full)."""
    from ovserve.server.runtime.shedding import refusal, retry_after_s

    hint = errors.Overloaded("busy", 2.2)
    assert (hint.retry_after_header(), hint.pushback_ms()) == ("3", "2200")
    assert errors.Overloaded("busy").retry_after_header() == "1"
    assert errors.Overloaded("busy", 0.01).pushback_ms() == "1000"
    assert errors.Overloaded("busy", 1e9).pushback_ms() == str(2**31 - 1)  # gRFC A6: a signed 32-bit integer
    # the requests ahead, in rounds of those run at once, each round one run long
    assert retry_after_s(ahead=5, at_once=2, cost=0.5) == 1.5
    assert retry_after_s(ahead=5, at_once=2, cost=None) == 1.0  # nothing measured yet
    err = refusal("this model", bound=4, ahead=5, at_once=1, cost=0.7)
    assert err.retry_after_header() == "4" and err.message.endswith("(max_queued_requests); retry in 4 s")


def test_names_and_values_quoted_in_an_error_are_cut() -> None:
    """Issue 33, item 10: a 20,000-character name is not echoed whole, whichever error quotes it."""
    from ovserve.common.errors import LONGEST_MESSAGE, LONGEST_QUOTED, InvalidInput, NotFound

    err = NotFound(f"model {'m' * 20_000!r} is not served; models are ['add']")
    assert len(err.message) < 2 * LONGEST_QUOTED and str(err) == err.message
    assert err.message.startswith("model 'mmm") and "...(20002 characters)" in err.message
    assert err.message.endswith("is not served; models are ['add']")
    short = "model 'add' has no version 3"
    assert InvalidInput(short).message == short
    many = InvalidInput(" ".join(["word"] * 2000))
    assert len(many.message) < LONGEST_MESSAGE + 40 and many.message.endswith("characters cut)")
