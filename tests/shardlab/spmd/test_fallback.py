"""The generated replicated fallback: flagged, exact, and never moving state."""

from __future__ import annotations

import numpy as np

from shardlab.ir import Graph, Op, TensorType, Value, ValueKind
from shardlab.mesh import Mesh
from shardlab.placement import DistSpec
from shardlab.spmd import infer
from shardlab.spmd.check import all_specs, check_completed, check_rule
from shardlab.spmd.complete import complete
from shardlab.strategy import Strategy

OPAQUE = {"output_types": [{"shape": [8, 4], "dtype": "float32"}], "reference": "tanh"}


def test_opaque_gets_the_replicated_rule_for_every_arriving_spec() -> None:
    mesh = Mesh((2, 2), ("x", "y"))
    rng = np.random.default_rng(0)
    t = TensorType((8, 4))
    for spec in all_specs(t, mesh):
        check = check_rule("opaque", [t], [spec], OPAQUE, mesh, rng)
        assert check.rule.fallback and check.rule.kernel == "replicated"
        assert [str(s) for s in check.rule.input_specs] == ["RR"]
        assert [str(s) for s in check.rule.output_specs] == ["RR"]
        assert check.max_abs_error[0] < 1e-12


def test_fallback_keeps_the_spec_of_state_updated_in_place() -> None:
    mesh = Mesh((2,), ("dp",))
    t = TensorType((8, 4))
    w = DistSpec.parse("S(0)", mesh)
    rule = infer("opaque", [t], [w], OPAQUE, mesh, inplace=[0])
    assert rule.fallback
    assert [str(s) for s in rule.output_specs] == ["S(0)"]
    assert "updates input 0 in place and keeps its spec S(0)" in rule.reason


def test_completion_keeps_an_in_place_param_update_sharded() -> None:
    values = [
        Value("w", TensorType((8, 4)), ValueKind.PARAM),
        Value("w.new", TensorType((8, 4)), ValueKind.PARAM),
    ]
    ops = [Op("update", "opaque", ("w",), ("w.new",), OPAQUE)]
    done = complete(Graph(values, ops), Strategy.build("dp=2", [], ["w=S(0)"]))
    assert done.fallback_ops() == ["update"]
    assert str(done.specs["w.new"]) == "S(0)"
    assert "updates input 0 in place" in done.decisions["w.new"][0].detail
    assert max(check_completed(done).values()) < 1e-12
