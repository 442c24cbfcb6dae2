"""TorchServe's two gRPC APIs, as ovserve serves them: ovserve's own copies of TorchServe's
``inference.proto`` (package ``org.pytorch.serve.grpc.inference``) and ``management.proto``
(``org.pytorch.serve.grpc.management``) and the stubs generated from them by ``scripts/gen_protos.py``.

Import the stub modules by name (``from ovserve.common.proto.torchserve import inference_pb2``);
this package imports none of them, so that importing it registers nothing in protobuf's default pool.
A process that imports these stubs cannot also import stubs a TorchServe user generated from
TorchServe's files (tests/ts_stubs.py): both define the same protobuf symbols.
"""
