"""Per-version model states, following OpenVINO Model Server."""
from __future__ import annotations

import enum
from dataclasses import dataclass


class State(str, enum.Enum):
    START = "START"
    LOADING = "LOADING"
    AVAILABLE = "AVAILABLE"
    UNLOADING = "UNLOADING"
    END = "END"


#: OVMS state -> the state word of the KServe/Triton repository index.
INDEX_STATE = {
    State.START: "LOADING",
    State.LOADING: "LOADING",
    State.AVAILABLE: "READY",
    State.UNLOADING: "UNLOADING",
    State.END: "UNAVAILABLE",
}


@dataclass(slots=True)
class Status:
    state: State = State.START
    error_code: str = "OK"
    error_message: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "state": self.state.value,
            "status": {"error_code": self.error_code, "error_message": self.error_message},
        }
