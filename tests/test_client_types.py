"""KServe's types in ``ovserve.client`` (client/infer_type.py) and ``RESTConfig``, in process: their REST forms,
every datatype, what they refuse and how. No protobuf here (their gRPC forms: test_client_grpc.py)."""
from __future__ import annotations

import ssl
import warnings

import numpy as np
import orjson
import pytest

from ovserve.client import (
    InferenceError,
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    InvalidInput,
    RequestedOutput,
    RESTConfig,
    UnsupportedProtocol,
)
from ovserve.common.errors import InvalidInput as CommonInvalidInput

from .client_fixtures import DATATYPES, sample, sample_input


def split(body: bytes, json_length: int | None) -> tuple[dict, bytes]:
    if json_length is None:
        return orjson.loads(body), b""
    return orjson.loads(body[:json_length]), body[json_length:]


# -- InferInput ----------------------------------------------------------------
def test_set_data_from_numpy_binary_and_json() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = InferInput("x", [2, 3], "fp32")  # the datatype is upper-cased, as KServe does
    t.set_data_from_numpy(x)
    assert (t.datatype, t.data, t.parameters) == ("FP32", None, {"binary_data_size": 24})
    assert t.as_numpy().tolist() == x.tolist()
    t.set_data_from_numpy(x, binary_data=False)
    assert t.data == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and t.parameters == {}
    assert t.as_numpy().dtype == np.float32 and t.as_numpy().shape == (2, 3)


def test_set_data_from_numpy_refuses_what_does_not_fit() -> None:
    t = InferInput("x", [2, 3], "FP32")
    with pytest.raises(InferenceError, match="must be a numpy array"):
        t.set_data_from_numpy([1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(InferenceError, match="unexpected datatype FP64 from numpy array, expected FP32"):
        t.set_data_from_numpy(np.zeros((2, 3)))
    with pytest.raises(InferenceError, match=r"unexpected numpy array shape \[3, 2\], expected \[2, 3\]"):
        t.set_data_from_numpy(np.zeros((3, 2), np.float32))
    text = InferInput("s", [1], "BYTES")
    with pytest.raises(InferenceError, match="UTF-8"):
        text.set_data_from_numpy(np.array([b"\xff"], dtype=object), binary_data=False)


@pytest.mark.parametrize("datatype", DATATYPES)
def test_every_datatype_in_every_form(datatype: str) -> None:
    for form in ("binary", "json", "list"):
        tensor, x = sample_input(datatype, form)
        got = tensor.as_numpy()
        assert got.dtype == x.dtype and got.tolist() == x.tolist(), form


def test_bytes_from_text_bytes_and_string_arrays() -> None:
    for arr in (np.array(["a", "é"]), np.array([b"a", "é".encode()]), np.array([b"a", "é"], dtype=object)):
        t = InferInput("s", [2], "BYTES")
        t.set_data_from_numpy(arr)
        assert t.as_numpy().tolist() == [b"a", "é".encode()]
        assert t.as_string() == ["a", "é"]
    with pytest.raises(InvalidInput, match="needs BYTES"):
        InferInput("x", [1], "FP32", data=[1.0]).as_string()


def test_malformed_data_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="needs 4 elements, got 3") as err:
        InferInput("x", [2, 2], "INT32", data=[1, 2, 3]).as_numpy()
    # KServe's InvalidInput is a ValueError; ovserve's is also the one hierarchy's
    assert isinstance(err.value, ValueError) and isinstance(err.value, CommonInvalidInput)
    assert err.value.reason == str(err.value)
    with pytest.raises(InvalidInput, match=r"1\.5 is not an integer"):
        InferInput("x", [1], "INT32", data=[1.5]).as_numpy()
    with pytest.raises(InvalidInput, match="unknown datatype 'FP8'"):
        InferInput("x", [1], "FP8", data=[1.0]).as_numpy()
    with pytest.raises(InvalidInput, match="has no data"):
        InferInput("x", [1], "FP32").as_numpy()


# -- REST forms ----------------------------------------------------------------
def test_to_rest_as_kserve_makes_it() -> None:
    """KServe's to_rest: values go as JSON, raw bytes binary; an id is made; the model is named."""
    values = InferInput("a", [2], "INT32", data=[1, 2])
    doc, length = InferRequest("m", [values]).to_rest()
    assert length is None and isinstance(doc, dict)
    assert doc["model_name"] == "m" and len(doc["id"]) == 36  # a uuid4
    assert doc["inputs"] == [{"name": "a", "shape": [2], "datatype": "INT32", "data": [1, 2]}]
    raw = InferInput("b", [2], "FP32")
    raw.set_data_from_numpy(np.array([1.5, -2.0], np.float32))
    body, length = InferRequest("m", [values, raw], request_id="r").to_rest()
    assert isinstance(body, bytes) and length is not None
    head, tail = split(body, length)
    assert head["id"] == "r" and head["inputs"][0]["data"] == [1, 2]
    assert head["inputs"][1]["parameters"] == {"binary_data_size": 8} and "data" not in head["inputs"][1]
    assert tail == np.array([1.5, -2.0], np.float32).tobytes()


def test_the_rest_client_sends_numeric_tensors_binary() -> None:
    """What InferenceRESTClient sends: numbers binary even from a list, JSON only where asked or for text."""
    listed = InferInput("a", [2], "INT32", data=[1, 2])
    asked_json = InferInput("b", [2], "FP32")
    asked_json.set_data_from_numpy(np.array([1.0, 2.0], np.float32), binary_data=False)
    text = InferInput("c", [1], "BYTES", data=["hello"])
    raw_bytes = InferInput("d", [1], "BYTES", data=[b"\xff\x00"])
    body, length = InferRequest("m", [listed, asked_json, text, raw_bytes])._rest_body()
    head, tail = split(body, length)
    a, b, c, d = head["inputs"]
    assert a["parameters"] == {"binary_data_size": 8} and "data" not in a
    assert b["data"] == [1.0, 2.0] and "parameters" not in b
    assert c["data"] == ["hello"]
    assert d["parameters"] == {"binary_data_size": 6}
    assert tail == np.array([1, 2], "<i4").tobytes() + b"\x02\x00\x00\x00\xff\x00"
    assert head["parameters"] == {"binary_data_output": True}
    # the caller's own choice of output encoding stands
    request = InferRequest("m", [listed], parameters={"binary_data_output": False},
                           request_outputs=[RequestedOutput("y", {"binary_data": True})])
    head, _ = split(*request._rest_body())
    assert head["parameters"] == {"binary_data_output": False}
    assert head["outputs"] == [{"name": "y", "parameters": {"binary_data": True}}]


def test_a_list_that_does_not_fit_is_refused_before_sending() -> None:
    with pytest.raises(InvalidInput, match="needs 4 elements, got 2"):
        InferRequest("m", [InferInput("x", [2, 2], "FP32", data=[1.0, 2.0])])._rest_body()


def test_request_from_bytes() -> None:
    raw = InferInput("b", [2], "FP64")
    raw.set_data_from_numpy(np.array([0.25, 4.0]))
    request = InferRequest("m", [InferInput("a", [1], "BOOL", data=[True]), raw], request_id="r",
                           request_outputs=[RequestedOutput("y")])
    body, length = request.to_rest()
    assert isinstance(body, bytes) and length is not None
    back = InferRequest.from_bytes(body, length, "m")
    assert back == request
    assert back.get_input_by_name("b").as_numpy().tolist() == [0.25, 4.0]  # type: ignore[union-attr]
    with pytest.raises(InvalidInput, match="does not fit the body"):
        InferRequest.from_bytes(body[:-1], length, "m")
    with pytest.raises(InvalidInput, match="Unrecognized request format"):
        InferRequest.from_bytes(b"{nope", 5, "m")


@pytest.mark.parametrize("datatype", DATATYPES)
def test_response_rest_round_trip(datatype: str) -> None:
    x = sample(datatype)
    out = InferOutput("y", [2, 4], datatype)
    out.set_data_from_numpy(x)
    for binary in (True, False):
        response = InferResponse("r", "m", [out], model_version="3", use_binary_outputs=binary)
        if datatype == "BYTES" and not binary:
            with pytest.raises(InvalidInput, match="not UTF-8"):
                response.to_rest()
            continue
        body, length = response.to_rest()
        back = (InferResponse.from_bytes(body, length) if isinstance(body, bytes)
                else InferResponse.from_rest(body))
        assert (back.id, back.model_name, back.model_version) == ("r", "m", "3")
        y = back.outputs[0]
        assert (y.name, y.datatype, y.shape) == ("y", datatype, [2, 4])
        assert y.as_numpy().dtype == x.dtype and y.as_numpy().tolist() == x.tolist(), binary
        assert y.data == x.reshape(-1).tolist()


def test_response_from_a_malformed_body_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="unreadable V2 response"):
        InferResponse.from_bytes(b"nope", 4)
    head = orjson.dumps({"model_name": "m", "outputs": [{"name": "y", "datatype": "FP32", "shape": [2],
                                                         "parameters": {"binary_data_size": 8}}]})
    with pytest.raises(InvalidInput, match=r"output 'y': shape \[2\] of FP32 needs 8 bytes, got 4"):
        InferResponse.from_bytes(head + b"\0" * 4, len(head))
    with pytest.raises(InvalidInput, match="not an object with a name and a datatype"):
        InferResponse.from_rest({"outputs": [{"shape": [1]}]})
    with pytest.raises(InvalidInput, match="Unexpected inference output 'z'"):
        InferResponse("r", "m", [], requested_outputs=[RequestedOutput("z")]).to_rest()


def test_kserve_attributes_and_equality() -> None:
    a = InferInput("x", [2], "INT64", data=[1, 2])
    b = InferInput("x", [2], "INT64")
    b.set_data_from_numpy(np.array([1, 2], np.int64), binary_data=False)
    assert a == b and a != InferInput("x", [2], "INT64", data=[1, 3])
    request = InferRequest("m", [a], request_id="r", raw_inputs=[np.array([5, 6], "<i8").tobytes()])
    assert request.from_grpc is False and a.as_numpy().tolist() == [5, 6]  # raw inputs land in the inputs
    assert request.use_binary_outputs is False
    assert InferRequest("m", [a], parameters={"binary_data_output": True}).use_binary_outputs is True
    assert request.to_dict()["model_name"] == "m" and RequestedOutput("y", {"binary_data": False}).binary_data is False
    assert InferResponse("r", "m", []).get_output_by_name("y") is None


# -- RESTConfig ----------------------------------------------------------------
class _Enum:
    value = "V2"


def test_rest_config_checks_its_fields() -> None:
    assert RESTConfig().protocol == "v1" and RESTConfig(protocol=_Enum()).protocol == "v2"
    with pytest.raises(UnsupportedProtocol, match="grpc-v2"):
        RESTConfig(protocol="grpc-v2")
    with pytest.raises(ValueError, match="retries"):
        RESTConfig(retries=-1)
    with pytest.raises(ValueError, match="timeout"):
        RESTConfig(timeout=0)
    with pytest.raises(TypeError, match="auth"):
        RESTConfig(auth="user:password")
    transport = type("AsyncHTTPTransport", (), {"__module__": "httpx._transports.default"})()
    with pytest.raises(TypeError, match="aiohttp connector"):
        RESTConfig(transport=transport)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        RESTConfig(http2=True)
    assert any("HTTP/1.1" in str(w.message) for w in caught)


def test_rest_config_tls_context() -> None:
    assert RESTConfig().ssl_context().verify_mode == ssl.CERT_REQUIRED
    loose = RESTConfig(verify=False).ssl_context()
    assert loose.verify_mode == ssl.CERT_NONE and loose.check_hostname is False
    own = ssl.create_default_context()
    assert RESTConfig(verify=own).ssl_context() is own
    with pytest.raises(ValueError, match="cert must be"):
        RESTConfig(cert=("a", "b", "c", "d")).ssl_context()
    with pytest.raises(FileNotFoundError):
        RESTConfig(cert="/nowhere/client.pem").ssl_context()
