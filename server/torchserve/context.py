"""What a TorchServe handler is handed as ``context``, without TorchServe.

The surface of TorchServe's ``ts.context.Context`` that handlers use (``manifest``,
``system_properties``, ``model_name``, ``request_ids``, request headers, sequence
ids, response content type and status), plus ovserve's own ``context.model``:
the compiled OpenVINO model (:class:`~.model.HandlerModel` in the server's process,
:class:`~.worker_main.RemoteModel` in a worker process), or None when the archive holds none.
Each worker has its own context, as each TorchServe worker
process has; the batch fields are set before every ``handle`` call.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a worker process's context.model is a RemoteModel: it loads none of the server's model code
    from .model import HandlerModel
    from .worker_main import RemoteModel

#: what an intermediate message goes to: (request id, the handler's value for it)
Send = Callable[[str, Any], None]


class _Metrics:
    """TorchServe's metrics cache as handlers call it: accepted and dropped (ovserve's metrics are its own)."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith(("add_", "get_")):
            return lambda *args, **kwargs: None
        raise AttributeError(name)


@dataclass
class Item:
    """One request of a batch, as the context tells a handler about it."""

    request_id: str
    headers: Mapping[str, str] = field(default_factory=dict)
    sequence_id: str = ""
    content_type: str = ""
    status: int = 200
    phrase: str = ""
    response_headers: dict[str, str] = field(default_factory=dict)


class Context:
    def __init__(self, model_name: str, model_dir: str, manifest: Mapping[str, Any], batch_size: int,
                 model: HandlerModel | RemoteModel | None, yaml_config: Mapping[str, Any] | None = None,
                 server_version: str = "") -> None:
        self.model_name = model_name
        self.manifest = dict(manifest)
        self.system_properties: dict[str, Any] = {
            "model_dir": model_dir,
            "gpu_id": None,
            "batch_size": batch_size,
            "server_name": "ovserve",
            "server_version": server_version,
            "limit_max_image_pixels": True,
        }
        self.model_yaml_config: dict[str, Any] = dict(yaml_config or {})
        self.model = model
        self.metrics = _Metrics()
        self.request_ids: dict[int, str] = {}
        self.stopping_criteria: Any = None
        self._items: list[Item] = []
        self._send: Send | None = None
        # TorchServe's own send_intermediate_predict_response (when TorchServe is installed) writes its
        # backend frame here; the socket reads it back into send_intermediate
        from .tsimport import FrontendSocket
        self.cl_socket = FrontendSocket(self)

    # -- set by the worker around each handle() call ---------------------------
    def begin(self, items: Sequence[Item], send: Send | None) -> None:
        self._items = list(items)
        self.request_ids = {i: item.request_id for i, item in enumerate(items)}
        self._send = send

    def items(self) -> list[Item]:
        return self._items

    # -- TorchServe's Context ---------------------------------------------------
    def get_request_id(self, idx: int = 0) -> str | None:
        return self.request_ids.get(idx)

    def get_request_header(self, idx: int, key: str) -> str | None:
        return self._item(idx).headers.get(key.lower())

    def get_all_request_header(self, idx: int) -> dict[str, str]:
        return dict(self._item(idx).headers)

    def get_sequence_id(self, idx: int) -> str:
        return self._item(idx).sequence_id

    def set_response_content_type(self, idx: int, value: str) -> None:
        self._item(idx).content_type = value

    def get_response_content_type(self, idx: int) -> str | None:
        return self._item(idx).content_type or None

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        item = self._item(idx)
        item.status, item.phrase = int(code), phrase

    def get_response_status(self, idx: int) -> tuple[int, str]:
        item = self._item(idx)
        return item.status, item.phrase

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        self._item(idx).response_headers[key] = value

    def get_response_headers(self, idx: int) -> dict[str, str]:
        return self._item(idx).response_headers

    def set_all_response_status(self, code: int = 200, phrase: str = "") -> None:
        for item in self._items:
            item.status, item.phrase = int(code), phrase

    # -- streaming: what ts.handler_utils.utils.send_intermediate_predict_response calls -------
    def send_intermediate(self, ret: Sequence[Any], req_id_map: Mapping[int, str] | None = None,
                          message: str = "", code: int = 200) -> None:
        """One intermediate message per batch item in ``ret``, each to its own request's stream."""
        if self._send is None:
            return  # Predictions (not a stream): TorchServe drops intermediate messages there too
        ids = req_id_map if req_id_map is not None else self.request_ids
        for idx, value in enumerate(ret):
            request_id = ids.get(idx) if isinstance(ids, Mapping) else None
            if request_id is None:
                raise ValueError(f"send_intermediate_predict_response: no request id for batch item {idx}")
            self._send(request_id, value)

    def _item(self, idx: int) -> Item:
        try:
            return self._items[idx]
        except IndexError:
            raise IndexError(f"batch item {idx} does not exist (the batch has {len(self._items)})") from None
