"""The server's commands as the tests run them: ``python -m ovserve.server COMMAND ...`` in a child
process on ephemeral ports, through :class:`ovserve.server.child.Child` (the helper the benchmark and
``ovserve run`` use too: its own process group, dead with pytest, its log read on a thread).

A child process is how users run the server, and it keeps the server's protobuf package
(``inference``) out of the test process, where tritonclient defines its own.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ovserve.server.child import HOST, Child

#: Full FP32 precision, so that expected values computed with numpy match
#: closely (the CPU plugin may otherwise run FP32 models in BF16).
EXACT = ["--plugin-config", '{"INFERENCE_PRECISION_HINT": "f32"}']

_P = TypeVar("_P", bound="ComponentProcess")


class ComponentProcess(Child):
    """A running ``python -m ovserve.server COMMAND ...`` with its bound ports and captured log."""

    name = "component"
    #: seconds to bind the ports and to become ready
    timeout: float = 60

    def __init__(self, command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
                 setup: Callable[[], None] | None = None) -> None:
        super().__init__([sys.executable, "-m", "ovserve.server", *command], env=env, cwd=cwd, setup=setup)

    @property
    def args(self) -> list[str]:
        return self.argv

    @property
    def rest_port(self) -> int:
        return self.ports.rest

    @property
    def grpc_port(self) -> int:
        return self.ports.grpc

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.rest_port}"

    @property
    def grpc_target(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    def wait_ports(self: _P, timeout: float | None = None) -> _P:
        super().wait_ports(timeout or self.timeout)
        return self

    def wait_ready(self: _P, timeout: float | None = None) -> _P:
        self.wait_ok(timeout=timeout or self.timeout)
        return self


class ServerProcess(ComponentProcess):
    """A running ``ovserve serve`` on ephemeral ports."""

    name = "server"

    def __init__(self, args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
                 setup: Callable[[], None] | None = None) -> None:
        super().__init__(["serve", "--host", HOST, "--rest-port", "0", "--grpc-port", "0", *args], env, cwd, setup)


class TransformerProcess(ComponentProcess):
    """A running ``ovserve transformer`` on ephemeral ports (REST and gRPC)."""

    name = "transformer"
    timeout = 30

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        super().__init__(["transformer", "--host", HOST, "--http_port", "0", "--grpc_port", "0", *args], env)


class ExplainerProcess(ComponentProcess):
    """A running ``ovserve explainer`` on an ephemeral REST port."""

    name = "explainer"
    timeout = 30

    def __init__(self, model: str, predictor: str, *extra: str) -> None:
        super().__init__(["explainer", "--model_name", model, "--predictor_host", predictor,
                          "--http_port", "0", "--host", HOST, *extra])
