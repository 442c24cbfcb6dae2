"""The ovserve benchmark: raw OpenVINO, ovserve and the KServe peer, back to back (see README.md)."""

import os

# Before anything imports grpc (it reads this once): no gRPC fork handlers in the bench's processes, which start
# servers with a fork and a preexec_fn (server/child.py) while their own gRPC calls may be running on other threads;
# gRPC's handlers then aborted a child between fork and exec now and then (tests/test_child.py).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
