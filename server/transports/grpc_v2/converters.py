"""Protobuf <-> neutral types. Protobuf messages never leave this module and the servicer."""
from __future__ import annotations

from typing import Any

from ovserve.common.codecs.datatypes import numpy_dtype
from ovserve.common.codecs.tensors import check_shape, from_raw, from_values, reply_parameters, to_raw
from ovserve.common.proto import grpc_predict_v2_pb2 as pb
from ovserve.common.proto.fields import CONTENTS_FIELD, extend_typed, params_from_pb, params_to_pb, typed_array

from ...errors import InvalidInput
from ...types import (
    Duration,
    InferRequest,
    InferResponse,
    ModelMetadata,
    RequestedOutput,
    Tensor,
    VersionStatistics,
)


def request_from_pb(msg: pb.ModelInferRequest) -> InferRequest:
    raw = msg.raw_input_contents
    if raw and len(raw) != len(msg.inputs):
        raise InvalidInput(
            f"raw_input_contents has {len(raw)} entries but the request has {len(msg.inputs)} inputs"
        )
    inputs = []
    for i, inp in enumerate(msg.inputs):
        where = f"input {inp.name!r}"
        if not inp.name:
            raise InvalidInput(f"inputs[{i}] needs a name")
        numpy_dtype(inp.datatype, where)
        shape = check_shape(inp.shape, where)
        if raw:
            if inp.HasField("contents"):
                raise InvalidInput(f"{where}: raw_input_contents and typed contents cannot be mixed in one request")
            array = from_raw(where, inp.datatype, shape, raw[i])
        else:
            field = CONTENTS_FIELD.get(inp.datatype)
            if field is None:
                raise InvalidInput(f"{where}: {inp.datatype} can only be sent in raw_input_contents")
            # from_values does the casting, so that a value out of the datatype's
            # range (300 in int_contents for INT8) is a clear InvalidInput; the
            # field's own type already rules out what JSON could hold (null, strings).
            values: Any = typed_array(inp.contents, inp.datatype)  # FP32/FP64/BOOL: their bytes, not a float each
            if values is None:
                values = list(getattr(inp.contents, field))
            array = from_values(where, inp.datatype, shape, values, typed=True)
        inputs.append(Tensor(inp.name, inp.datatype, shape, array, params_from_pb(inp.parameters)))
    outputs = [RequestedOutput(o.name, params_from_pb(o.parameters)) for o in msg.outputs]
    return InferRequest(
        model_name=msg.model_name,
        model_version=msg.model_version,
        id=msg.id,
        parameters=params_from_pb(msg.parameters),
        inputs=inputs,
        outputs=outputs,
    )


def used_typed_contents(msg: pb.ModelInferRequest) -> bool:
    return bool(msg.inputs) and not msg.raw_input_contents


def response_to_pb(resp: InferResponse, typed: bool) -> pb.ModelInferResponse:
    out = pb.ModelInferResponse(model_name=resp.model_name, model_version=resp.model_version, id=resp.id)
    if resp.parameters:
        params_to_pb(out.parameters, resp.parameters)
    # Typed contents only when the client used them and every output has a field.
    typed = typed and all(t.datatype in CONTENTS_FIELD for t in resp.outputs)
    for t in resp.outputs:
        tensor = out.outputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
        params = reply_parameters(t.parameters)
        if params:
            params_to_pb(tensor.parameters, params)
        if typed:
            extend_typed(tensor.contents, t.datatype, t.data)
        else:
            out.raw_output_contents.append(to_raw(t.data, t.datatype))
    return out


def metadata_to_pb(md: ModelMetadata) -> pb.ModelMetadataResponse:
    resp = pb.ModelMetadataResponse(name=md.name, versions=md.versions, platform=md.platform)
    for spec in md.inputs:
        resp.inputs.add(name=spec.name, datatype=spec.datatype, shape=spec.shape)
    for spec in md.outputs:
        resp.outputs.add(name=spec.name, datatype=spec.datatype, shape=spec.shape)
    return resp


def _duration(d: Duration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


def statistics_to_pb(stats: list[VersionStatistics]) -> pb.ModelStatisticsResponse:
    """Triton's ModelStatisticsResponse (cache_hit and cache_miss at zero: there is no response cache)."""
    resp = pb.ModelStatisticsResponse()
    for s in stats:
        resp.model_stats.append(pb.ModelStatistics(
            name=s.name, version=s.version, last_inference=s.last_inference, inference_count=s.inference_count,
            execution_count=s.execution_count,
            inference_stats=pb.InferStatistics(
                success=_duration(s.success), fail=_duration(s.fail), queue=_duration(s.queue),
                compute_input=_duration(s.compute_input), compute_infer=_duration(s.compute_infer),
                compute_output=_duration(s.compute_output), cache_hit=_duration(s.cache_hit),
                cache_miss=_duration(s.cache_miss)),
            batch_stats=[pb.InferBatchStatistics(
                batch_size=b.batch_size, compute_input=_duration(b.compute_input),
                compute_infer=_duration(b.compute_infer), compute_output=_duration(b.compute_output))
                for b in s.batch_stats],
        ))
    return resp
