"""The data plane's interfaces: which component offers which extension, and how a missing one is refused.

A component's class says what it offers (docs/design.md, "The data plane and its extensions"); the
transports ask with ``explainer_of``, ``repository_of`` and ``statistics_of``, and a component without
the extension is refused with Unsupported (501 / UNIMPLEMENTED), after NotFound for a model it does not know.
"""
from __future__ import annotations

import pytest

from ovserve.server.components.explainer import Explainer
from ovserve.server.components.transformer import Transformer, TransformerDataPlane
from ovserve.server.dataplane import (
    EXTENSIONS,
    DataPlane,
    Explains,
    ModelRepository,
    Statistics,
    TorchServe,
    explainer_of,
    repository_of,
    statistics_of,
)
from ovserve.server.errors import NotFound, Unsupported
from ovserve.server.model_server import ModelServer
from ovserve.server.torchserve.registry import HandlerRegistry

#: every extension, TorchServe's (offered beside a data plane, by the model server's handler registry) too
ALL = (*EXTENSIONS, TorchServe)


@pytest.mark.parametrize(("component", "offers"), [
    (ModelServer, {ModelRepository, Statistics}),
    (TransformerDataPlane, set()),
    (Explainer, {Explains}),
    (HandlerRegistry, {TorchServe}),
], ids=lambda v: getattr(v, "__name__", ""))
def test_each_component_offers_what_its_class_declares(component: type, offers: set[type]) -> None:
    assert {e for e in ALL if issubclass(component, e)} == offers
    # declared, not only matched: the class names the extension among its bases
    assert {e for e in ALL if e in component.__mro__} == offers
    assert issubclass(component, DataPlane) is (component is not HandlerRegistry)


def test_the_core_has_no_extension_method() -> None:
    """No default body answers for an extension: a component lacks an extension's methods altogether."""
    for extension in ALL:
        members = {n for n in vars(extension) if not n.startswith("_")}
        assert members, extension
        assert not members & set(dir(DataPlane)), extension
        assert not members & set(dir(TransformerDataPlane)), extension


def test_an_extension_declared_is_an_extension_implemented() -> None:
    class Half(ModelRepository):
        def repository_index(self, ready_only: bool = False) -> list:  # type: ignore[type-arg]
            return []

    with pytest.raises(TypeError, match="load_model"):
        Half()  # type: ignore[abstract]


def test_a_transformer_is_refused_each_extension_with_its_reason() -> None:
    plane = TransformerDataPlane("m", Transformer(), predictor=None)
    with pytest.raises(Unsupported, match=r"^a transformer has no model repository; ask the predictor$"):
        repository_of(plane)
    with pytest.raises(Unsupported, match="a transformer has no model repository"):
        repository_of(plane, "m")
    with pytest.raises(NotFound, match="this transformer serves 'm'"):
        repository_of(plane, "other")  # an unknown model is NotFound before the refusal
    with pytest.raises(Unsupported, match=r"^ovserve-transformer runs no model and keeps no inference statistics"):
        statistics_of(plane)
    with pytest.raises(Unsupported, match=r"^model 'm' has no explainer configured; run an explainer component"):
        explainer_of(plane, "m")
    with pytest.raises(NotFound):
        explainer_of(plane, "other")


def test_an_explainer_explains_and_is_refused_the_rest() -> None:
    plane = Explainer("m", client=None)  # type: ignore[arg-type]
    assert explainer_of(plane, "m") is plane
    with pytest.raises(Unsupported, match=r"^ovserve-explainer runs no model and keeps no inference statistics"):
        statistics_of(plane, "m")
    with pytest.raises(NotFound, match="not explained here"):
        repository_of(plane, "other")
