"""The client's protocol types, in a protobuf descriptor pool of its own, and its calls without generated stubs.

``tritonclient.grpc``, the ``kserve`` SDK and ovserve's own stubs (:mod:`ovserve.common.proto`) all define
protobuf package ``inference`` in protobuf's default descriptor pool, and a TorchServe user's generated stubs
define ``org.pytorch.serve.grpc.*`` there as ovserve's do (:mod:`ovserve.common.proto.torchserve`): two sets
in one process fail with "duplicate symbol". So the client never imports those stubs. Its message classes
come from :data:`POOL`, a ``DescriptorPool()`` apart from the default one, filled from the serialized
FileDescriptorProtos scripts/gen_protos.py writes beside the stubs (:mod:`ovserve.common.proto.descriptor_set`:
the same .proto files, google/rpc/status.proto and the well-known types they import added first), and its
calls are made by :func:`stub` with ``channel.unary_unary`` and its kin (a generated ``_pb2_grpc`` module
would import the default-pool messages). A process may then import ovserve's client beside tritonclient,
kserve and a TorchServe user's stubs; the server keeps the generated stubs (a server process has no other
``inference`` package), and a transformer holds both halves, which meet only in neutral types.

The classes here are not the generated ones, nor another stub set's: a message of any set, whatever pool
its class comes from, is told by its full name (:func:`is_message`) and goes on the wire by its own
``SerializeToString``, the wire format being one.

For the type checker, :data:`v2`, :data:`ts_inference`, :data:`ts_management` and :data:`empty` are the
generated modules (their .pyi describe these very messages, field for field); at run time they are
namespaces of this pool's classes, so ``v2.ModelInferRequest(...)`` reads as it does with the stubs.
"""
from __future__ import annotations

import operator
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import Message

from ovserve.common.proto.descriptor_set import FILES

__all__ = ["POOL", "v2", "ts_inference", "ts_management", "empty", "stub", "is_message"]

#: the client's own pool; nothing of it is in protobuf's default pool
POOL = descriptor_pool.DescriptorPool()
#: the same pool, untyped: types-protobuf leaves DescriptorPool's methods unannotated
_pool: Any = POOL
for _name, _serialized in FILES:  # dependencies first, as the pool requires
    _pool.AddSerializedFile(_serialized)


def _messages(file_name: str) -> SimpleNamespace:
    """The top-level messages of ``file_name`` in :data:`POOL`, as classes by name (nested ones are their
    attributes, as in a generated module)."""
    file = _pool.FindFileByName(file_name)
    return SimpleNamespace(DESCRIPTOR=file, **{name: message_factory.GetMessageClass(descriptor)
                                                for name, descriptor in file.message_types_by_name.items()})


if TYPE_CHECKING:
    from google.protobuf import empty_pb2 as empty

    from ovserve.common.proto import grpc_predict_v2_pb2 as v2
    from ovserve.common.proto.torchserve import inference_pb2 as ts_inference
    from ovserve.common.proto.torchserve import management_pb2 as ts_management
else:
    v2 = _messages("grpc_predict_v2.proto")  # KServe V2: protobuf package inference
    ts_inference = _messages("inference.proto")  # TorchServe: org.pytorch.serve.grpc.inference
    ts_management = _messages("management.proto")  # TorchServe: org.pytorch.serve.grpc.management
    empty = _messages("google/protobuf/empty.proto")  # google.protobuf.Empty (TorchServe's Ping)


def is_message(value: object, full_name: str) -> bool:
    """Is ``value`` a message of type ``full_name``, of this pool's classes or any other stubs' (tritonclient's,
    kserve's, ovserve's server stubs, a TorchServe user's)?"""
    return isinstance(value, Message) and value.DESCRIPTOR.full_name == full_name


#: a request goes on the wire by its own serializer: a message of any stub set with the method's type
_serialize = operator.methodcaller("SerializeToString")


def stub(channel: grpc.aio.Channel, service: str) -> Any:
    """What a generated stub of ``service`` (a full name) has, over :data:`POOL`: one multi-callable per method,
    by the method's name, for the channel. Replies are this pool's classes; requests may be any stub set's."""
    kinds = {(False, False): channel.unary_unary, (False, True): channel.unary_stream,
             (True, False): channel.stream_unary, (True, True): channel.stream_stream}
    methods = {}
    for method in _pool.FindServiceByName(service).methods:
        make: Any = kinds[method.client_streaming, method.server_streaming]
        methods[method.name] = make(f"/{service}/{method.name}", request_serializer=_serialize,
                                    response_deserializer=message_factory.GetMessageClass(method.output_type).FromString,
                                    _registered_method=True)
    return SimpleNamespace(**methods)
