"""JSON views of a plan's placements: every parameter for other tools, every value for the UI.

What it is for: the one home of the plan's placement views.

- `parameter_placements(plan)` is `shardlab export-plan --format json` (and the service's
  export route): the mesh, and every parameter with its module FQN, its shape and its
  placement on every mesh axis, in torch's layout (`placements`, nn.Linear weights
  [out, in]) and in Shardlab's (`shardlab_placements`, with `transposed` saying whether the
  two layouts differ: `export.parameters` states the rule). A placement is `"R"` or
  `"S(d)"`; a partial parameter cannot be exported (ExportError naming it).
- `placements_view(plan)` is the worker's stored `placements` artifact (the sharding and
  graph views read it): per serial value its spec, the decisions that set it, the input that
  drove them (`next`) and the reshards its consumers asked for. Its shape is unchanged from
  when `worker.engine` built it.
"""

from __future__ import annotations

from typing import Any

from shardlab.export.parameters import parameter_layouts
from shardlab.placement import Placement, Shard
from shardlab.plan import Plan
from shardlab.spmd.explain import driving_input

PLACEMENTS_FORMAT = "shardlab.placements/1"


def _text(p: Placement) -> str:
    return f"S({p.dim})" if isinstance(p, Shard) else "R"


def parameter_placements(plan: Plan) -> dict[str, Any]:
    """Every parameter's placements, for other tools (module docstring)."""
    mesh = plan.strategy.mesh
    params = []
    for p in parameter_layouts(plan):
        params.append({
            "name": p.name,
            "module": p.module,
            "attr": p.attr,
            "kind": p.kind,
            "shape": list(p.torch_shape),
            "shardlab_shape": list(p.shape),
            "transposed": p.transposed,
            "placements": {a: _text(p.torch_placement(a)) for a in p.placements},
            "shardlab_placements": {a: _text(x) for a, x in p.placements.items()},
        })  # fmt: skip
    out: dict[str, Any] = {
        "format": PLACEMENTS_FORMAT,
        "model": plan.model.name,
        "strategy": plan.strategy.describe(),
        "mesh": {
            "shape": list(mesh.shape),
            "axes": list(mesh.axis_names),
            "ranks": list(mesh.ranks),
        },
        "layout": "torch: nn.Linear weights are [out, in]; shardlab_* fields are the plan's own",
        "parameters": params,
    }
    if plan.pipeline is not None:
        a = plan.pipeline.assignment
        out["pipeline"] = {
            "axis": "pp",
            "stages": [{"stage": s, "layers": a.layers_of_stage(s)} for s in range(a.pp)],
        }
    return out


def placements_view(plan: Plan) -> dict[str, Any]:
    """Per serial value: its spec, the decisions that set it and the input that drove them
    (`next`: follow it for the whole chain), plus the reshards its consumers asked for."""
    completed = plan.completed
    values: dict[str, Any] = {}
    for name in completed.graph.values:
        if name not in completed.specs:
            continue
        values[name] = {
            "spec": str(completed.specs[name]),
            "decisions": [
                {"spec": d.spec, "source": d.source, "detail": d.detail, "op": d.op}
                for d in completed.decisions.get(name, ())
            ],
            "next": driving_input(completed, name),
            "reshards": [],
        }
    for op_name, index, have, need in completed.reshards():
        value = completed.graph.op(op_name).inputs[index]
        if value in values:
            values[value]["reshards"].append({"op": op_name, "have": str(have), "need": str(need)})
    return {"mesh": str(plan.strategy.mesh), "values": values}
