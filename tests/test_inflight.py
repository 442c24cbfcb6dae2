"""tests/inflight.py, the condition the drain tests wait for: it holds only once the server process has
read the requests, which a stopped server (SIGSTOP: its kernel still accepts and buffers) never does."""
from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tgrpc

from . import models
from .clients import binary_infer, grpc_infer
from .inflight import Uploads
from .servers import EXACT

X = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)  # 4 KiB: buffered whole by a stopped server's kernel


@pytest.mark.parametrize("transport", ["rest", "grpc"])
def test_requests_count_as_read_only_once_the_server_reads_them(transport: str, tmp_path: Path, start_server) -> None:
    models.save(models.add_one(), tmp_path / "repo", "add")
    server = start_server("--model-repository", tmp_path / "repo", *EXACT)
    client = tgrpc.InferenceServerClient(server.grpc_target)
    assert client.is_server_live()  # connected before the mark
    uploads = Uploads(server.rest_port if transport == "rest" else server.grpc_port)
    sent, result = threading.Event(), {}

    def call() -> None:
        answer: Any = binary_infer(server.url, "add", X, sent) if transport == "rest" else grpc_infer(client, "add", X)
        result["y"] = answer

    def wait(timeout: float = 30) -> None:  # as the drain tests do: REST knows when it sent, gRPC by the bytes
        if transport == "rest":
            uploads.wait(sent=sent.is_set, timeout=timeout)
        else:
            uploads.wait(X.nbytes, timeout=timeout)

    server.signal(signal.SIGSTOP)
    worker = threading.Thread(target=call)
    try:
        worker.start()
        with pytest.raises(AssertionError, match="not read by the server"):
            wait(timeout=1)
        acked, unacked, unread = uploads.state()
        assert acked >= X.nbytes and unacked == 0 and unread > 0, (acked, unacked, unread)  # in its kernel, unread
    finally:
        server.signal(signal.SIGCONT)
    wait()
    worker.join(30)
    np.testing.assert_array_equal(result["y"], X + 1)
    client.close()
