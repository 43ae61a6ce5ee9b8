"""Strategies: text forms, JSON round trip, template resolution, clear errors."""

from __future__ import annotations

import pytest

from shardlab.errors import MeshError, PlacementError
from shardlab.mesh import Mesh
from shardlab.placement import Replicate, Shard
from shardlab.strategy import Annotation, Strategy, StrategyError, match_values


def test_annotation_text_forms() -> None:
    mesh = Mesh((2, 4), ("dp", "tp"))
    full = Annotation.parse("layers.*.mlp.up_proj.weight=RS(1)", mesh)
    assert full.placements == (("dp", Replicate()), ("tp", Shard(1)))
    named = Annotation.parse("tokens=dp:S(0)", mesh)
    assert named.placements == (("dp", Shard(0)),)
    both = Annotation.parse("x = tp:R, dp:S(0)", mesh)
    assert both.placements == (("dp", Shard(0)), ("tp", Replicate()))
    assert Annotation.parse(both.text(), mesh) == both


@pytest.mark.parametrize(
    ("text", "error", "pattern"),
    [
        ("w0", StrategyError, r"annotation 'w0' is not of the form 'glob=placements'"),
        (
            "w0=S(0)",
            PlacementError,
            r"annotation 'w0=S\(0\)':.*1 placement but the mesh has 2 axes",
        ),
        ("w0=pp:S(0)", MeshError, r"unknown mesh axis 'pp'"),
        ("w0=dp:S(0),dp:R", StrategyError, r"names mesh axis 'dp' twice"),
    ],
)
def test_bad_annotations(text: str, error: type[Exception], pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        Annotation.parse(text, Mesh((2, 4), ("dp", "tp")))


def test_templates_resolve_to_axes() -> None:
    s = Strategy.build("dp=2,tp=4", ["dp", "megatron_tp", "fsdp:tp"])
    assert [str(t) for t in s.templates] == ["dp:dp", "megatron_tp:tp", "fsdp:tp"]
    assert [str(t) for t in Strategy.build("x=2", ["dp"]).templates] == ["dp:x"]
    with pytest.raises(StrategyError, match=r"unknown template 'zero4'; known templates: dp"):
        Strategy.build("dp=2", ["zero4"])
    with pytest.raises(StrategyError, match=r"template 'megatron_tp' needs a mesh axis.*a, b"):
        Strategy.build("a=2,b=2", ["megatron_tp"])
    with pytest.raises(StrategyError, match=r"unknown mesh axis 'pp'"):
        Strategy.build("dp=2", ["dp:pp"])


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        ({"optimiser": "sgd"}, r"unknown strategy option 'optimiser'; options: passes, optimizer"),
        ({"optimizer": "adam"}, r"option 'optimizer' must be one of adamw, sgd, got 'adam'"),
        ({"lr": 0}, r"option 'lr' must be a positive number, got 0"),
        ({"lr": "1e-3"}, r"option 'lr' must be a positive number, got '1e-3'"),
        ({"lr": float("nan")}, r"option 'lr' must be a positive number, got nan"),
        ({"lr": True}, r"option 'lr' must be a positive number, got True"),
    ],
)
def test_bad_options_are_named(options: dict[str, object], pattern: str) -> None:
    with pytest.raises(StrategyError, match=pattern):
        Strategy.build("dp=2", ["dp"], options=options)
    with pytest.raises(StrategyError, match=pattern):
        Strategy.from_json({"mesh": "dp=2", "options": options})


def test_good_options_are_kept() -> None:
    options = {"optimizer": "sgd", "lr": 0.5, "passes": {"dp_overlap": False}}
    assert Strategy.build("dp=2", ["dp"], options=options).options == options


def test_strategy_json_round_trip() -> None:
    s = Strategy.build("dp=2,tp=4", ["dp", "megatron_tp"], ["w0=RS(1)"], {"passes": ["x"]})
    again = Strategy.from_json(s.to_json())
    assert again == s
    assert Strategy.from_json({"mesh": "dp=2", "templates": ["dp"], "annotations": ["x=S(0)"]})


def test_glob_matching() -> None:
    names = ["layers.0.mlp.up_proj.weight", "layers.10.mlp.up_proj.weight", "embed.weight"]
    assert match_values("layers.*.mlp.up_proj.weight", names) == names[:2]
    assert match_values("embed.weight", names) == ["embed.weight"]
    assert match_values("nope", names) == []
