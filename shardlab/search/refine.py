"""Per-op refinement of a search's best tensor-parallel plan: the layer's integer program
(`layer_ilp`) chooses every op's placement on the `tp` axis, and the result is planned and
costed like any candidate, so it wins only where the full cost model agrees.

The program sees one layer of the model at the batch one replica runs, with the parameter
state bytes of the candidate's data-parallel recipe, and the memory left to the layers.
Its placements go on every repeat of the layer as annotations over the candidate's own
templates (Megatron's still place the embedding and the head). Where its plan does not fit,
the program is solved again with less memory, twice at most.

`Refinement.differs` lists each value of the layer whose placement differs from the
templates' (Megatron tensor parallelism, with sequence parallelism where the candidate has
it): what a reviewer reads to see what the program found.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, replace
from typing import Any

from shardlab.cost.clusters import Cluster
from shardlab.ir import Graph, ValueKind
from shardlab.mesh import Mesh
from shardlab.models.config import OVERRIDABLE
from shardlab.placement import Placement, Replicate
from shardlab.search.bound import state_bytes, wide_params
from shardlab.search.evaluate import Evaluation, evaluate
from shardlab.search.layer_ilp import LayerILPError, LayerSolution, solve_layer
from shardlab.search.space import Candidate
from shardlab.templates import TEMPLATES

#: Fractions of the usable memory the program may give the layers, tried in turn.
BUDGETS = (0.9, 0.75, 0.6)


@dataclass
class Refinement:
    """The refined candidate's evaluation, the program's solution and how it differs."""

    base: Evaluation
    evaluation: Evaluation | None = None
    solution: LayerSolution | None = None
    differs: list[tuple[str, str, str]] = field(default_factory=list)
    error: str | None = None
    #: the cost model's peak memory over the program's own estimate, at the templates
    memory_scale: float = 1.0

    def to_json(self) -> dict[str, Any]:
        return {
            "base": self.base.candidate.label(),
            "label": self.evaluation.candidate.label() if self.evaluation else None,
            "step_time_s": self.evaluation.step_time_s if self.evaluation else None,
            "fits": self.evaluation.fits if self.evaluation else False,
            "solution": self.solution.to_json() if self.solution else None,
            "differs": [{"value": v, "templates": t, "ilp": i} for v, t, i in self.differs],
            "memory_scale": self.memory_scale,
            "error": self.error,
        }


def refine(base: Evaluation, model: Graph, cluster: Cluster, headroom: float) -> Refinement:
    """Refine `base` (a planned candidate without a pipeline, tp > 1) on `model`."""
    from shardlab.models import build_model

    out = Refinement(base)
    c = base.candidate
    config = dict(model.meta.get("config") or {})
    settings = {k: config[k] for k in OVERRIDABLE if k in config}
    micro = c.mesh.dp * (c.microbatches or 1)  # what one replica runs at once
    settings.update(layers=1, batch=max(1, int(config.get("batch", 1)) // micro))
    layer = build_model(str(model.meta["preset"]), settings)
    usable = cluster.hbm_bytes * (1.0 - headroom)
    layers = int(config.get("layers", 1))
    state = _state_bytes(c, layer)
    sequence_parallel = c.sequence_parallel
    template = _template_placements(layer, c.mesh.tp, sequence_parallel)
    try:  # the program's memory, scaled to what the cost model says the templates take
        priced = solve_layer(layer, cluster, c.mesh.tp, float("inf"), layers=layers,
                             state_bytes=state, fixed=template)  # fmt: skip
        scale = (base.peak_memory_bytes or 0) / (priced.memory_bytes * layers)
        out.memory_scale = scale
        for fraction in BUDGETS:
            solution = solve_layer(layer, cluster, c.mesh.tp, usable * fraction / scale,
                                   layers=layers, state_bytes=state)  # fmt: skip
            sequence_parallel = solution.sequence_sharded(layer)
            templates = ["megatron_tp"] + (["sequence_parallel"] if sequence_parallel else [])
            refined = replace(c, sequence_parallel=sequence_parallel,
                              annotations=tuple(solution.annotations(layer)))  # fmt: skip
            assert refined.templates()[-len(templates) :] == templates
            out.solution, out.evaluation = solution, evaluate(refined, model, cluster, headroom)
            if out.evaluation.error is not None or out.evaluation.fits:
                break
    except LayerILPError as exc:
        out.error = exc.message
        return out
    if out.solution is not None:
        out.differs = _differs(layer, template, out.solution)
    return out


def _state_bytes(c: Candidate, layer: Graph) -> float:
    """Bytes per parameter element under the candidate's recipe, its gradient included (the
    program counts what a layer keeps at its backward)."""
    wide = wide_params(layer)
    grad = 4.0 / (c.state_shards if c.dp_recipe in ("zero2", "fsdp", "zero3", "hsdp") else 1)
    return state_bytes(c.dp_recipe, c.state_shards, wide) + grad


def _template_placements(layer: Graph, tp: int, sequence_parallel: bool) -> dict[str, Placement]:
    """The placement on `tp` that Megatron's templates give each value of `layer` they
    annotate (a parameter they leave alone stays replicated)."""
    mesh = Mesh((tp,), ("tp",))
    placed: dict[str, Placement] = {
        v.name: Replicate() for v in layer.values_of_kind(ValueKind.PARAM)
    }
    prior: dict[tuple[str, str], Placement] = {}
    names = ["megatron_tp"] + (["sequence_parallel"] if sequence_parallel else [])
    for name in names:
        for ann in TEMPLATES[name].fn(layer, mesh, "tp", prior):
            for value, p in _matches(layer, ann.pattern, dict(ann.placements).get("tp")):
                placed[value] = p
                prior[(value, "tp")] = p
    return placed


def _differs(
    layer: Graph, template: dict[str, Placement], solution: LayerSolution
) -> list[tuple[str, str, str]]:
    """(value, the templates' placement, the program's) for each value they differ on."""
    return [
        (value, str(template[value]), str(ilp))
        for value, ilp in sorted(solution.placements.items())
        if value in template and template[value] != ilp
    ]


def _matches(layer: Graph, pattern: str, p: Placement | None) -> list[tuple[str, Placement]]:
    if p is None:
        return []
    return [(v.name, p) for v in layer.values.values() if fnmatch.fnmatchcase(v.name, pattern)]
