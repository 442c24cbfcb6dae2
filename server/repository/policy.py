"""Model version policies: latest{num_versions}, specific{versions}, all."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidInput


@dataclass(frozen=True, slots=True)
class VersionPolicy:
    kind: str = "latest"  # latest | specific | all
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def select(self, available: list[int]) -> list[int]:
        found = sorted(set(available))
        if self.kind == "all":
            return found
        if self.kind == "specific":
            return [v for v in found if v in self.versions]
        return found[-self.num_versions :] if self.num_versions > 0 else []

    @classmethod
    def parse(cls, raw: object, where: str) -> VersionPolicy:
        """Parse OVMS's ``model_version_policy`` object."""
        if raw in (None, {}):
            return cls()
        if not isinstance(raw, dict) or len(raw) != 1:
            raise InvalidInput(f"{where}: model_version_policy must have exactly one of latest, specific, all")
        (kind, body), = raw.items()
        if not isinstance(body, dict):
            raise InvalidInput(f"{where}: model_version_policy.{kind} must be an object")
        if kind == "all":
            return cls("all")
        if kind == "latest":
            n = body.get("num_versions", 1)
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise InvalidInput(f"{where}: latest.num_versions must be a positive integer")
            return cls("latest", num_versions=n)
        if kind == "specific":
            vs = body.get("versions")
            positive = isinstance(vs, list) and all(
                isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in vs)
            if not vs or not positive:
                raise InvalidInput(f"{where}: specific.versions must be a non-empty list of positive integers")
            return cls("specific", versions=tuple(sorted(set(vs))))
        raise InvalidInput(f"{where}: unknown model_version_policy {kind!r} (latest, specific or all)")
