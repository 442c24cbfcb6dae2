"""What the server and the client both speak, and nothing else.

``ovserve.common`` holds the neutral request and response types, the error
hierarchy with its status table, the tensor codecs (the datatype table, BYTES
framing, raw and value decoding) and the KServe V2 protobuf stubs. It needs
numpy (and protobuf and grpcio for the stubs) only: ``ovserve.server`` and
``ovserve.client`` both import it, and it imports neither.
"""
