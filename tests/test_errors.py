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
