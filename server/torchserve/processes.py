"""A handler's worker as a process of its own: the server's side.

TorchServe runs every worker as a process, so that nothing a handler does (``sys.exit``,
``os._exit``, a segfault in a native library, a leak, a call that never returns) can end
the server or its other models. ovserve does the same for every handler that is not its
own (``--ts-workers process``, the default): :class:`ProcessRunner` starts
``python -m ovserve.server.torchserve.worker_main`` with one end of a Unix socket pair,
sends it the batches and reads back its answers (:mod:`.worker_main` is the other side,
:mod:`.wire` the messages: JSON and bytes, never pickle, so nothing the worker sends
runs code in the server).

The worker's ``context.model`` calls come back over the same socket and run through the
server's own inference path (:class:`~.model.HandlerModel`: its checks, image decoding,
dynamic batching and infer requests), each as a task of its own, so a handler's
threads may call at once. Their large tensors cross in the worker's shared-memory
arena (:mod:`.arena`, ``--ts-worker-arena-mib``), made here for each worker that has a
model and closed when it ends; a worker that names a place outside it is killed.

A worker that ends (its exit code or signal is the reason given) fails the batch it
had with :class:`~.runners.WorkerLost`; one that breaks the protocol is killed. A
worker that overruns the response timeout is killed (``stop(now=True)``), which a
thread could not be.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import FailedPrecondition, InternalError, InvalidInput, ServerError, Unavailable
from ..types import PortInfo
from . import wire
from .arena import Arena, ArenaError
from .model import HandlerModel
from .results import failure, failure_doc, status_error
from .runners import Job, Value, WorkerLost

log = logging.getLogger("ovserve.torchserve")

#: how long a worker asked to stop may take to finish its batch and exit before it is killed
STOP_GRACE_S = 5.0
#: a worker whose socket closed inside a message and that has exited within this long died (SIGKILL, the OOM
#: killer): its exit is reported, not a protocol break
DIED_WITHIN_S = 2.0
_READ_LIMIT = 1 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def model_doc(model: HandlerModel) -> dict[str, Any]:
    """``context.model`` as the worker process is told it."""
    def port(p: PortInfo) -> dict[str, Any]:
        return {"name": p.name, "datatype": p.datatype, "shape": list(p.spec.shape), "layout": p.layout}

    return {"name": model.name, "version": model.version, "inputs": [port(p) for p in model.inputs],
            "outputs": [port(p) for p in model.outputs], "labels": model.labels}


def exit_text(returncode: int | None) -> str:
    """How a worker process ended, as a client and the log are told."""
    if returncode is None:
        return "ended"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "an unknown signal"
        return f"was killed by signal {-returncode} ({name})"
    return f"exited with code {returncode}"


class ProcessRunner:
    """One worker process: one handler instance, one batch at a time."""

    def __init__(self, where: str, worker: int, proc: asyncio.subprocess.Process, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, model: HandlerModel | None, arena: Arena | None = None) -> None:
        self.where = where
        self.worker = worker
        self.pid = proc.pid
        self._proc = proc
        self._reader = reader
        self._writer = writer
        self._model = model
        self._arena = arena  # the large tensors of its context.model calls (None: all on the socket)
        self._jobs: dict[str, Job] = {}
        self._reply: asyncio.Future[tuple[wire.Header, wire.Parts]] | None = None
        self._calls: set[asyncio.Task[None]] = set()
        self._ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._stopping = ""  # why the server ends it, once it does
        self._broke = ""  # how it broke the protocol, once it did (the server kills it for that)
        self._dispatcher: asyncio.Task[None] | None = None

    # -- starting -------------------------------------------------------------------
    @classmethod
    async def start(cls, where: str, worker: int, settings: Mapping[str, Any], model: HandlerModel | None,
                    startup_timeout_s: float, arena_bytes: int = 0) -> ProcessRunner:
        """A worker process with its handler initialised; InvalidInput naming why when it cannot be.
        ``arena_bytes``: the shared memory its ``context.model`` calls' large tensors cross (0: none)."""
        ours, theirs = socket.socketpair()
        arena = None
        try:
            if model is not None and arena_bytes > 0:
                arena = Arena.create(arena_bytes, str(worker))
            fds = [theirs.fileno()] if arena is None else [theirs.fileno(), arena.fd()]
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", f"{__package__}.worker_main", str(theirs.fileno()),
                pass_fds=fds, stdin=asyncio.subprocess.DEVNULL)
        except OSError as exc:  # no process (or memory) to be had (EAGAIN, ENOMEM): the server's trouble
            ours.close()
            if arena is not None:
                arena.close()
            raise Unavailable(f"{where}: cannot start a worker process: {exc.strerror or exc}") from None
        except BaseException:
            ours.close()
            if arena is not None:
                arena.close()
            raise
        finally:
            theirs.close()
        if arena is not None:
            arena.close_fd()  # the worker has its own; the server keeps its mapping
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=_READ_LIMIT)
        runner = cls(where, worker, proc, reader, writer, model, arena)
        start = {"op": "start", "worker": worker, "where": where, **settings,
                 "model": model_doc(model) if model is not None else None,
                 "arena": None if arena is None else {"fd": fds[1], "size": arena.size}}
        try:
            try:
                wire.write(writer, start)
                await writer.drain()
                header, _ = await asyncio.wait_for(wire.read(reader), startup_timeout_s)
            except TimeoutError:
                await runner._end_now()
                raise InvalidInput(f"{where}: the handler did not initialize within the startup timeout "
                                   f"({startup_timeout_s:g} s); its worker process was killed") from None
            except (EOFError, wire.WireError, ConnectionError) as exc:
                why = exit_text(await runner._exit_code())
                raise InvalidInput(f"{where}: the handler's worker process {why} while starting"
                                   + ("" if isinstance(exc, EOFError) else f" ({exc})")) from None
            except BaseException:
                await runner._end_now()
                raise
            if header["op"] == "init_failed":
                await runner._exit_code()
                raise InvalidInput(f"{where}: handler failed to initialize: {header.get('message', '')}")
            if header["op"] != "ready":
                await runner._end_now()
                raise InternalError(f"{where}: the worker process answered {header['op']!r} to its start")
        except BaseException:
            if arena is not None:
                arena.close()  # a worker that never served: its arena goes now
            raise
        runner._dispatcher = asyncio.create_task(runner._dispatch(), name=f"ovserve-ts-process-{worker}")
        return runner

    # -- the Runner protocol -------------------------------------------------------------
    async def run(self, batch: Sequence[Job]) -> list[Value]:
        if self._ended.done():
            raise WorkerLost(self._ended.result())
        parts: wire.OutParts = []
        items = []
        for job in batch:
            keys = list(job.data)
            parts.extend(bytes(job.data[k]) for k in keys)
            items.append({"id": job.item.request_id, "headers": dict(job.item.headers), "seq": job.item.sequence_id,
                          "keys": keys, "stream": job.send is not None})
        self._jobs = {job.item.request_id: job for job in batch}
        reply = self._reply = asyncio.get_running_loop().create_future()
        try:
            try:
                wire.write(self._writer, {"op": "handle", "items": items}, parts)
                await self._writer.drain()
            except ConnectionError:
                pass  # the process is gone: the dispatcher fails the reply with why
            header, got = await reply
        finally:
            self._jobs, self._reply = {}, None
        if header["op"] == "failed":
            raise failure(header.get("error"))
        return self._values(header, got, len(batch))

    def _values(self, header: wire.Header, parts: wire.Parts, n: int) -> list[Value]:
        described = header.get("values")
        if not isinstance(described, list) or len(described) != n:
            raise InternalError(f"{self.where}: the worker answered a batch of {n} with something else")
        out: list[Value] = []
        for d in described:
            if isinstance(d, dict) and isinstance(d.get("status"), int):
                out.append(status_error(d["status"], str(d.get("phrase") or "")))
            elif isinstance(d, dict) and isinstance(d.get("part"), int) and 0 <= d["part"] < len(parts):
                out.append(parts[d["part"]])
            else:
                raise InternalError(f"{self.where}: the worker answered a value it did not send")
        return out

    def stop(self, now: bool = False) -> None:
        """Ask the process to end (after its batch); ``now``: kill it."""
        if self._ended.done():
            return
        if now:
            self._stopping = self._stopping or "was stopped by the server"
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            return
        self._stopping = self._stopping or "was stopped by the server"
        with contextlib.suppress(ConnectionError, RuntimeError):
            wire.write(self._writer, {"op": "stop"})
        asyncio.get_running_loop().call_later(STOP_GRACE_S, self.stop, True)

    def ended(self) -> asyncio.Future[str]:
        return self._ended

    def memory(self) -> int:
        try:
            with open(f"/proc/{self.pid}/statm", encoding="ascii") as f:
                return int(f.read().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            return 0

    # -- reading the worker -------------------------------------------------------------------
    def _break(self, how: str) -> None:
        """The worker broke the protocol: killed, its batch and calls failed naming ``how``."""
        if self._broke:
            return
        self._broke = f"broke the worker protocol ({how}) and was killed"
        log.error("%s: worker %d (pid %d) %s", self.where, self.worker, self.pid, self._broke)
        with contextlib.suppress(ProcessLookupError):
            self._proc.kill()

    async def _dispatch(self) -> None:
        try:
            while True:
                header, parts = await wire.read(self._reader)
                op = header["op"]
                if "release" in header and self._arena is not None:
                    self._arena.release(header["release"])
                if op in ("done", "failed"):
                    if self._reply is not None and not self._reply.done():
                        self._reply.set_result((header, parts))
                elif op == "message":
                    job = self._jobs.get(str(header.get("id")))
                    if job is not None and job.send is not None and parts:
                        job.send(parts[0])
                elif op in ("infer", "decode"):
                    task = asyncio.create_task(self._answer(header, parts))
                    self._calls.add(task)
                    task.add_done_callback(self._calls.discard)
                else:
                    raise wire.WireError(f"unknown message {op!r}")
        except (EOFError, ConnectionError):
            pass
        except wire.CutShort as exc:
            if not await self._exits_within(DIED_WITHIN_S):
                self._break(str(exc))
        except (wire.WireError, ArenaError) as exc:
            self._break(str(exc))
        why = self._broke or self._stopping or exit_text(await self._exit_code())
        if self._broke or self._stopping:
            await self._exit_code()
        for task in list(self._calls):
            task.cancel()
        self._writer.close()
        if self._arena is not None:
            self._arena.close()  # its memory goes with the last view an inference may still hold
        if self._reply is not None and not self._reply.done():
            self._reply.set_exception(WorkerLost(why))
        if not self._ended.done():
            self._ended.set_result(why)

    async def _answer(self, header: wire.Header, parts: wire.Parts) -> None:
        """A ``context.model`` call from the worker, through the server's own inference path."""
        call = header.get("call")
        try:
            if self._model is None:
                raise FailedPrecondition(f"{self.where} has no OpenVINO model: context.model is None")
            if header["op"] == "infer":
                try:
                    inputs = wire.unpack_values(header.get("inputs"), parts,
                                                None if self._arena is None else self._arena.request_view)
                except wire.WireError as exc:
                    raise InvalidInput(f"context.model.infer: {exc}") from None
                except ArenaError as exc:  # not a mistake a handler makes through context.model: the worker's own
                    self._break(f"context.model named {exc}")
                    return
                wanted = header.get("outputs")
                names = [str(n) for n in wanted] if isinstance(wanted, list) else None
                result: dict[str, Any] = await self._model.infer_async(inputs, names or None)
            else:
                name = header.get("input")
                loop = asyncio.get_running_loop()
                images = await loop.run_in_executor(None, self._model.decode_images, parts,
                                                    name if isinstance(name, str) else None)
                result = {"images": images}
            out: wire.OutParts = []
            described = wire.pack_values(result, out, None if self._arena is None else self._arena.put_answer)
            wire.write(self._writer, {"op": "answer", "call": call, "outputs": described}, out)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not isinstance(exc, ServerError):
                log.error("%s: a context.model call failed: %s: %s", self.where, type(exc).__name__, exc)
            wire.write(self._writer, {"op": "refused", "call": call, "error": failure_doc(exc)})
        with contextlib.suppress(ConnectionError):
            await self._writer.drain()

    # -- ending ------------------------------------------------------------------------------
    async def _exits_within(self, seconds: float) -> bool:
        """Whether the process exits (or has) within ``seconds``."""
        try:
            await asyncio.wait_for(self._proc.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def _exit_code(self) -> int | None:
        """The process's exit status, once it has exited (killed if it lingers past the grace)."""
        try:
            return await asyncio.wait_for(self._proc.wait(), STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            return await self._proc.wait()

    async def _end_now(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._proc.kill()
        await self._proc.wait()
        self._writer.close()
