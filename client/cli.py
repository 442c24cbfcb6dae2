"""``ovserve infer`` (``ovserve-infer`` in the client-only install): one inference from a terminal or a pod.

What curl and grpcurl cannot do for tensors: each input is encoded in the model's own datatype (read from
the model's metadata), a file given as ``NAME=@PATH`` goes as one BYTES element (an encoded image, as the
server expects it), a JSON value as a tensor of its nesting's shape (fitted to the model's shape when the
count allows), and the outputs, raw binary tensors on both wires, are printed as JSON arrays of their shape.

It is built on the public clients (:class:`~.kserve_grpc.InferenceGRPCClient`,
:class:`~.kserve_rest.InferenceRESTClient`), so it does what a user's code would. ``add_parser`` and ``main``
are what ``ovserve``'s own command line calls (``server/cli.py`` dispatches ``infer`` here by module name);
:func:`entry` is the console script of the ``ovserve-client`` distribution. Exit status: 0 answered, 1 the
call failed (the server's error, unreachable, timed out), 2 a usage error.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import math
import os
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any
from urllib.parse import quote, urlsplit

import numpy as np
import orjson

from ovserve.common.codecs.datatypes import UNSUPPORTED, V2_TO_NUMPY

from .exceptions import ConnectError, HTTPStatusError, InferenceError, InvalidInput, InvalidURL, TimeoutException
from .infer_type import InferInput, InferOutput, InferRequest, InferResponse, RequestedOutput
from .kserve_rest import InferenceRESTClient, RESTConfig

EXIT_FAILED = 1
EXIT_USAGE = 2
#: URL scheme -> (protocol, TLS)
SCHEMES = {"grpc": ("grpc", False), "grpcs": ("grpc", True), "http": ("rest", False), "https": ("rest", True)}


class UsageError(ValueError):
    """The command line asks for something that cannot be sent (exit status 2)."""


class CallFailed(Exception):
    """The call was made and failed: the server's answer, or no answer (exit status 1)."""


@dataclass(frozen=True)
class Target:
    """Where to send: ``protocol`` "grpc" (``address`` host:port) or "rest" (``address`` a base URL)."""

    protocol: str
    address: str
    tls: bool


@dataclass
class InputArg:
    """One input as the command line gave it: file contents (``--input NAME=@PATH``, repeatable) or JSON."""

    name: str
    files: list[bytes] = field(default_factory=list)
    value: Any = None
    is_json: bool = False


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", metavar="URL",
                   help="grpc://HOST:PORT, grpcs://HOST:PORT (TLS), http://HOST:PORT or https://HOST:PORT[/PREFIX]; "
                   "a bare HOST:PORT needs --protocol")
    p.add_argument("model", metavar="MODEL", help="the model's name")
    p.add_argument("-i", "--input", dest="inputs", action="append", required=True, metavar="NAME=VALUE",
                   help="an input: NAME=@FILE sends the file as one BYTES element (an encoded image; repeat the "
                   "input for a batch; @- reads standard input), NAME=JSON a tensor ([[1,2],[3,4]], \"text\"); "
                   "repeat for every input")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=D1,D2",
                   help="the shape of input NAME (default: the JSON's nesting, fitted to the model's shape when "
                   "the count allows; [N] for N files)")
    p.add_argument("--datatype", action="append", default=[], metavar="NAME=TYPE",
                   help="the V2 datatype of input NAME (default: the model's metadata, else from the JSON; BYTES "
                   "for files: another type sends the file's bytes as the raw little-endian tensor)")
    p.add_argument("-o", "--output", dest="outputs", action="append", default=[], metavar="NAME",
                   help="ask for this output only (repeat for several; default: every output)")
    p.add_argument("--model-version", default="", metavar="V", help="a version of the model (default: the server's)")
    p.add_argument("--protocol", choices=("grpc", "rest"), help="for a URL without a scheme: KServe V2 gRPC or REST")
    p.add_argument("--request-id", default=None, metavar="ID", help="the request's id, echoed in the answer")
    p.add_argument("-H", "--header", dest="headers", action="append", default=[], metavar="'NAME: VALUE'",
                   help="a header (gRPC: metadata) sent with every call, e.g. 'authorization: Bearer T'")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="how long each call may take (default 60; 0: no limit)")
    tls = p.add_argument_group("TLS (with grpcs:// or https://)")
    tls.add_argument("--cacert", metavar="FILE", help="the CA certificates to trust (PEM; default: the system's)")
    tls.add_argument("--cert", metavar="FILE", help="the client certificate of mutual TLS (PEM)")
    tls.add_argument("--key", metavar="FILE", help="the client certificate's private key (PEM)")
    tls.add_argument("-k", "--insecure", action="store_true",
                     help="REST only: do not verify the server's certificate")
    p.add_argument("--pretty", action="store_true", help="indent the JSON printed")


DESCRIPTION = ("Send one inference to a KServe V2 server (ovserve, OVMS, Triton, KServe) over gRPC or REST and "
               "print the outputs as JSON: {\"model_name\", \"model_version\", \"id\", \"outputs\": [{\"name\", "
               "\"datatype\", \"shape\", \"data\"}]}. Exit status 1 when the call failed (the server's message on "
               "standard error), 2 for a usage error.")
EPILOG = """examples:
  %(prog)s grpc://localhost:8081 mobilenet_v2 --input image=@cat.jpg -o top_labels -o top_scores
  %(prog)s http://localhost:8080 add_one --input 'x=[[1,2,3,4]]' --pretty
  %(prog)s https://models.example.com/serving linear -i 'x=[1,2,3]' --shape x=1,3 -H 'authorization: Bearer T'
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``infer`` sub-command, on ``ovserve``'s parser."""
    p = sub.add_parser("infer", help="send one inference (gRPC or REST) and print the outputs as JSON",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _arguments(p)
    p.set_defaults(infer_prog=p.prog)


def build_parser() -> argparse.ArgumentParser:
    """The standalone command, ``ovserve-infer``."""
    p = argparse.ArgumentParser(prog="ovserve-infer", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _arguments(p)
    p.set_defaults(infer_prog=p.prog)
    return p


def entry(argv: Sequence[str] | None = None) -> int:
    """The ``ovserve-infer`` console script."""
    return main(build_parser().parse_args(argv))


# -- the command line, read --------------------------------------------------------------------------------------


def parse_target(url: str, protocol: str | None) -> Target:
    """The protocol, address and TLS a URL (and ``--protocol``) name."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else None
    if scheme is None:
        if protocol is None:
            raise UsageError(f"{url!r} has no scheme: write grpc://{url} or http://{url} (or give --protocol)")
        return Target(protocol, url if protocol == "grpc" else f"http://{url}", False)
    if scheme not in SCHEMES:
        raise UsageError(f"{url!r}: the scheme must be one of {', '.join(s + '://' for s in SCHEMES)}")
    kind, tls = SCHEMES[scheme]
    if protocol is not None and protocol != kind:
        raise UsageError(f"--protocol {protocol} contradicts the URL's scheme {scheme}://")
    parts = urlsplit(url)
    if not parts.netloc:
        raise UsageError(f"{url!r} names no host")
    if kind == "grpc":
        if parts.path.strip("/") or parts.query:
            raise UsageError(f"{url!r}: a gRPC address is HOST:PORT, without a path")
        return Target(kind, parts.netloc, tls)
    return Target(kind, url.rstrip("/"), tls)


def _named(text: str, flag: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise UsageError(f"{flag} {text!r}: write NAME=VALUE")
    return name, value


def read_inputs(texts: Sequence[str], stdin: IO[bytes] | None = None) -> list[InputArg]:
    """Each ``--input``, files read and JSON parsed, in the order first named."""
    found: dict[str, InputArg] = {}
    for text in texts:
        name, value = _named(text, "--input")
        arg = found.setdefault(name, InputArg(name))
        if value.startswith("@"):
            if arg.is_json:
                raise UsageError(f"input {name!r}: give either JSON once or files (@PATH), not both")
            path = value[1:]
            try:
                if path == "-":
                    arg.files.append((stdin or sys.stdin.buffer).read())
                else:
                    with open(path, "rb") as f:
                        arg.files.append(f.read())
            except OSError as exc:
                raise UsageError(f"input {name!r}: cannot read {path!r}: {exc.strerror or exc}") from None
            continue
        if arg.files or arg.is_json:
            raise UsageError(f"input {name!r}: give JSON once (one tensor), or files (@PATH, repeatable)")
        try:
            arg.value, arg.is_json = orjson.loads(value), True
        except orjson.JSONDecodeError as exc:
            raise UsageError(f"input {name!r}: {value[:40]!r} is not JSON ({exc}); a file is {name}=@PATH") from None
    return list(found.values())


def read_shapes(texts: Sequence[str]) -> dict[str, list[int]]:
    shapes = {}
    for text in texts:
        name, value = _named(text, "--shape")
        try:
            dims = [int(d) for d in value.strip("[]()").replace(" ", "").split(",") if d != ""]
        except ValueError:
            raise UsageError(f"--shape {text!r}: the dimensions are integers, e.g. {name}=1,3,224,224") from None
        if any(d < 0 for d in dims):
            raise UsageError(f"--shape {text!r}: a dimension cannot be negative")
        shapes[name] = dims
    return shapes


def read_datatypes(texts: Sequence[str]) -> dict[str, str]:
    datatypes = {}
    for text in texts:
        name, value = _named(text, "--datatype")
        datatype = value.upper()
        if datatype in UNSUPPORTED:
            raise UsageError(f"--datatype {text!r}: {UNSUPPORTED[datatype]}")
        if datatype not in V2_TO_NUMPY:
            raise UsageError(f"--datatype {text!r}: not a V2 datatype ({', '.join(V2_TO_NUMPY)})")
        datatypes[name] = datatype
    return datatypes


def read_headers(texts: Sequence[str]) -> dict[str, str]:
    headers = {}
    for text in texts:
        name, sep, value = text.partition(":")
        if not sep or not name.strip():
            raise UsageError(f"--header {text!r}: write 'NAME: VALUE'")
        headers[name.strip()] = value.strip()
    return headers


# -- the tensors ---------------------------------------------------------------------------------------------------


def _json_datatype(name: str, probe: np.ndarray) -> str:
    """The datatype a JSON value suggests, for an input the model's metadata does not describe."""
    kind = probe.dtype.kind
    if kind == "b":
        return "BOOL"
    if kind in "iu":
        return "INT64"
    if kind == "f":
        return "FP32"
    if kind == "U":
        return "BYTES"
    raise UsageError(f"input {name!r}: give numbers, booleans or strings (of one kind), or --datatype")


def _probe(name: str, value: Any) -> np.ndarray:
    try:
        probe = np.array(value)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"input {name!r}: not a tensor ({exc})") from None
    if probe.dtype == object:
        raise UsageError(f"input {name!r}: not a tensor: nested lists of one length, of numbers, booleans or strings")
    return probe


def json_array(name: str, value: Any, datatype: str) -> np.ndarray:
    """A JSON value as an array of ``datatype``; refuses what numpy would change silently (1.5 to an INT)."""
    probe = _probe(name, value)
    if datatype == "BYTES":
        if probe.dtype.kind != "U":
            raise UsageError(f"input {name!r} is BYTES: give strings (or a file, {name}=@PATH)")
        out = np.empty(probe.shape, dtype=object)
        out.reshape(-1)[:] = [s.encode("utf-8") for s in probe.reshape(-1).tolist()]
        return out
    if probe.dtype.kind == "U":
        raise UsageError(f"input {name!r} is {datatype}: give numbers, not strings")
    target = V2_TO_NUMPY[datatype]
    if target.kind in "iub" and probe.dtype.kind == "f" and not np.all(np.mod(probe, 1) == 0):
        raise UsageError(f"input {name!r} is {datatype}: give {'true/false' if target.kind == 'b' else 'integers'}")
    if target.kind == "b" and probe.dtype.kind != "b" and not np.all((probe == 0) | (probe == 1)):
        raise UsageError(f"input {name!r} is BOOL: give true/false (or 0/1)")
    try:
        return np.array(value, dtype=target)  # from the JSON itself: numpy refuses out-of-range integers there
    except OverflowError:
        raise UsageError(f"input {name!r}: a value does not fit {datatype}") from None


def fit_shape(given: list[int], count: int, model: list[int] | None) -> list[int]:
    """The JSON's own shape, or the model's when it has the same number of elements (at most one dimension
    dynamic): ``[1, 2, 3, 4]`` to a ``[-1, 4]`` input is ``[1, 4]``."""
    if model is None or (len(given) == len(model) and all(m < 0 or m == g for g, m in zip(given, model, strict=True))):
        return given
    known = math.prod(d for d in model if d >= 0)
    dynamic = sum(1 for d in model if d < 0)
    if dynamic == 0 and known == count:
        return list(model)
    if dynamic == 1 and known > 0 and count % known == 0:
        return [count // known if d < 0 else d for d in model]
    return given  # the server says what is wrong


def build_input(arg: InputArg, shape: list[int] | None, datatype: str | None,
                spec: dict[str, Any] | None) -> InferInput:
    """One ``InferInput`` from the command line's value, ``--shape`` and ``--datatype``, and the model's ``spec``
    of that input (its metadata, None when the model does not list it)."""
    name = arg.name
    array: np.ndarray
    if arg.files:
        datatype = datatype or "BYTES"
        if datatype == "BYTES":
            array = np.empty(len(arg.files), dtype=object)
            array[:] = arg.files
        elif len(arg.files) > 1:
            raise UsageError(f"input {name!r} is {datatype}: one file holds the raw tensor, got {len(arg.files)}")
        else:
            dtype = V2_TO_NUMPY[datatype]
            if len(arg.files[0]) % dtype.itemsize:
                raise UsageError(f"input {name!r}: the file's {len(arg.files[0])} bytes are not a whole number of "
                                 f"{datatype} elements ({dtype.itemsize} bytes each)")
            array = np.frombuffer(arg.files[0], dtype=dtype)
            if shape is None and spec is not None:
                shape = fit_shape(list(array.shape), array.size, list(spec.get("shape", [])))
    else:
        datatype = datatype or (spec or {}).get("datatype") or _json_datatype(name, _probe(name, arg.value))
        if datatype not in V2_TO_NUMPY:
            raise UsageError(f"input {name!r}: the model takes {datatype}, which the client cannot encode from JSON")
        array = json_array(name, arg.value, datatype)
        if shape is None and spec is not None:
            shape = fit_shape(list(array.shape), array.size, list(spec.get("shape", [])))
    if shape is not None and list(shape) != list(array.shape):
        if math.prod(shape) != array.size:
            raise UsageError(f"input {name!r}: {array.size} element(s) do not fill the shape {shape}")
        array = array.reshape(shape)
    tensor = InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


@dataclass
class Plan:
    """The request the command line describes, before the model's metadata is known."""

    model: str
    version: str
    inputs: list[InputArg]
    shapes: dict[str, list[int]]
    datatypes: dict[str, str]
    outputs: list[str]
    request_id: str | None

    def needs_metadata(self) -> bool:
        """Whether the model's metadata decides a datatype or a shape (an image file needs neither)."""
        for a in self.inputs:
            datatype, shaped = self.datatypes.get(a.name), a.name in self.shapes
            if a.is_json and (datatype is None or not shaped):
                return True
            if a.files and datatype not in (None, "BYTES") and not shaped:  # a raw tensor, fitted to the model
                return True
        return False

    def request(self, metadata: dict[str, Any] | None) -> InferRequest:
        specs = {s["name"]: s for s in (metadata or {}).get("inputs", [])}
        tensors = [build_input(a, self.shapes.get(a.name), self.datatypes.get(a.name), specs.get(a.name))
                   for a in self.inputs]
        outputs = [RequestedOutput(o) for o in self.outputs] or None
        return InferRequest(self.model, tensors, request_id=self.request_id, request_outputs=outputs,
                            model_version=self.version or None)


def plan(ns: argparse.Namespace) -> Plan:
    """The command line's request, read and checked."""
    inputs = read_inputs(ns.inputs)
    shapes, datatypes = read_shapes(ns.shape), read_datatypes(ns.datatype)
    unknown = (set(shapes) | set(datatypes)) - {a.name for a in inputs}
    if unknown:
        raise UsageError(f"--shape/--datatype for no --input: {', '.join(sorted(unknown))}")
    return Plan(ns.model, ns.model_version, inputs, shapes, datatypes, list(ns.outputs), ns.request_id)


# -- the answer ----------------------------------------------------------------------------------------------------


def _output(out: InferOutput) -> dict[str, Any]:
    array = out.as_numpy()
    doc: dict[str, Any] = {"name": out.name, "datatype": out.datatype, "shape": list(array.shape)}
    if out.datatype != "BYTES":
        doc["data"] = np.ascontiguousarray(array) if array.ndim else array.item()
        return doc
    flat = [bytes(v) for v in array.reshape(-1)]
    try:
        items: list[Any] = [v.decode("utf-8") for v in flat]
    except UnicodeDecodeError:  # binary elements: every one as base64, said once
        items, doc["encoding"] = [base64.b64encode(v).decode("ascii") for v in flat], "base64"
    doc["data"] = np.array(items, dtype=object).reshape(array.shape).tolist() if array.ndim else items[0]
    return doc


def render(response: InferResponse) -> dict[str, Any]:
    """The answer as printed: its model, version, id and every output with its data nested to its shape."""
    return {"model_name": response.model_name, "model_version": response.model_version or "", "id": response.id,
            "outputs": [_output(o) for o in response.outputs]}


def dumps(doc: dict[str, Any], pretty: bool = False) -> bytes:
    """The answer's JSON line; ``pretty``: indented, each output's shape and data still on one line (one
    number a line would bury the structure)."""
    if not pretty:
        return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
    mark = f"ovserve-{secrets.token_hex(8)}-"
    compact = {f"{mark}{i}-{key}": o[key] for i, o in enumerate(doc["outputs"]) for key in ("shape", "data")}
    outputs = [{**o, "shape": f"{mark}{i}-shape", "data": f"{mark}{i}-data"} for i, o in enumerate(doc["outputs"])]
    text = orjson.dumps({**doc, "outputs": outputs}, option=orjson.OPT_INDENT_2)
    for placeholder, value in compact.items():
        text = text.replace(f'"{placeholder}"'.encode(), orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY), 1)
    return text + b"\n"


# -- the calls -----------------------------------------------------------------------------------------------------


def _server_message(exc: HTTPStatusError) -> str:
    reply = exc.response
    try:
        doc = reply.json()
        message = doc.get("error", doc) if isinstance(doc, dict) else doc
    except ValueError:
        message = reply.text.strip()
    return f"{reply.status_code} {reply.reason_phrase}: {message}"


async def _rest(ns: argparse.Namespace, target: Target, todo: Plan, headers: dict[str, str],
                timeout: float | None) -> InferResponse:
    cert: str | tuple[str, str] | None = (ns.cert, ns.key) if ns.cert and ns.key else ns.cert
    verify: str | bool = False if ns.insecure else (ns.cacert or True)
    try:
        async with InferenceRESTClient(RESTConfig(protocol="v2", timeout=timeout, cert=cert, verify=verify)) as client:
            metadata = None
            if todo.needs_metadata():
                metadata = await client.model_metadata(target.address, todo.model, todo.version, headers=headers)
            request = todo.request(metadata)
            if not todo.version:
                reply = await client.infer(target.address, request, model_name=todo.model, headers=headers)
            else:
                # KServe's REST client puts no version in its infer URL: post to the version's own endpoint,
                # the outputs asked as JSON (a graph endpoint's answer is read as JSON)
                request.parameters = {**(request.parameters or {}), "binary_data_output": False}
                url = (f"{target.address}/v2/models/{quote(todo.model, safe='')}"
                       f"/versions/{quote(todo.version, safe='')}/infer")
                doc = await client.infer(url, request, headers=headers, is_graph_endpoint=True)
                reply = InferResponse.from_rest(doc) if isinstance(doc, dict) else doc
    except HTTPStatusError as exc:
        raise CallFailed(_server_message(exc)) from None
    except (ConnectError, TimeoutException, InvalidURL) as exc:  # their messages name the URL
        raise CallFailed(str(exc)) from None
    if not isinstance(reply, InferResponse):
        raise CallFailed(f"{target.address}: not a V2 answer: {str(reply)[:200]}")
    return reply


async def _grpc(ns: argparse.Namespace, target: Target, todo: Plan, headers: dict[str, str],
                timeout: float | None) -> InferResponse:
    import grpc  # here only: a REST call loads neither grpc nor protobuf

    from .kserve_grpc import InferenceGRPCClient

    if ns.insecure:
        raise UsageError("--insecure is REST only: gRPC always verifies the server's certificate (give --cacert)")
    if ns.cert and not ns.key:
        raise UsageError("gRPC's mutual TLS needs --key with --cert")
    try:
        async with InferenceGRPCClient(target.address, use_ssl=target.tls, root_certificates=ns.cacert,
                                       private_key=ns.key, certificate_chain=ns.cert, timeout=timeout) as client:
            metadata = None
            if todo.needs_metadata():
                metadata = await client.model_metadata(todo.model, todo.version, headers=headers)
            return await client.infer(todo.request(metadata), headers=headers)
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details()  # grpc.aio's errors have both
        raise CallFailed(f"{code.name if code is not None else 'UNKNOWN'}: {details}") from None


async def run(ns: argparse.Namespace) -> dict[str, Any]:
    """The call the command line describes; the answer as printed."""
    target = parse_target(ns.url, ns.protocol)
    if (ns.cacert or ns.cert or ns.key or ns.insecure) and not target.tls:
        raise UsageError("--cacert, --cert, --key and --insecure need TLS: a grpcs:// or https:// URL")
    if ns.key and not ns.cert:
        raise UsageError("--key needs --cert")
    if not math.isfinite(ns.timeout) or ns.timeout < 0:
        raise UsageError(f"--timeout {ns.timeout}: give seconds >= 0 (0: no limit)")
    headers = read_headers(ns.headers)
    todo = plan(ns)
    call = _grpc if target.protocol == "grpc" else _rest
    return render(await call(ns, target, todo, headers, ns.timeout or None))


def main(ns: argparse.Namespace, out: IO[bytes] | None = None, err: IO[str] | None = None) -> int:
    """Run the command: the answer's JSON on ``out``, a failure's message on ``err``; the exit status."""
    out, err = out or sys.stdout.buffer, err or sys.stderr
    prog = getattr(ns, "infer_prog", "ovserve infer")
    if not os.environ.get("GRPC_VERBOSITY"):  # before grpc loads: a failed TLS handshake is our one line, not
        os.environ["GRPC_VERBOSITY"] = "ERROR"  # gRPC's own log lines too (GRPC_VERBOSITY=INFO brings them back)
    try:
        doc = asyncio.run(run(ns))
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=err)
        return EXIT_USAGE
    except CallFailed as exc:
        print(f"{prog}: {exc}", file=err)
        return EXIT_FAILED
    except (InvalidInput, InferenceError) as exc:  # a request the client refused to encode, or a malformed reply
        print(f"{prog}: {exc}", file=err)
        return EXIT_FAILED
    except OSError as exc:  # a certificate file that cannot be read
        print(f"{prog}: {exc}", file=err)
        return EXIT_FAILED
    out.write(dumps(doc, ns.pretty))
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(entry())
