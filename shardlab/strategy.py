"""A parallelization strategy: a mesh, templates on named mesh axes, annotations, options.

Templates (`shardlab.templates`) only write annotations (`shardlab.annotation`); they apply in
the order given, then user annotations apply, and a later annotation overrides an earlier one
on the same (value, mesh axis).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardlab.annotation import (
    Annotation,
    StrategyError,
    TemplateUse,
    match_values,
    parse_axis_placements,
)
from shardlab.autodiff import OPTIMIZERS
from shardlab.mesh import Mesh
from shardlab.passes.pipeline_schedule import MAX_MICROBATCHES, PipelineOptions
from shardlab.recompute import POLICIES
from shardlab.templates import resolve_template

__all__ = [
    "OPTIONS",
    "Annotation",
    "Strategy",
    "StrategyError",
    "TemplateUse",
    "check_options",
    "match_values",
    "parse_axis_placements",
]


#: The options a strategy may carry: the optimization passes to run (names and options are
#: checked by `passes.manager.resolve_passes`), the optimizer and its learning rate, the
#: activation recomputation policy (`shardlab.recompute`), on a mesh with a `pp` axis the
#: pipeline's schedule (`passes.pipeline_schedule.PipelineOptions`) and, on a mesh without
#: one, gradient accumulation: `microbatches` run one after another before one optimizer
#: step (`Strategy.accumulation`).
OPTIONS = ("passes", "optimizer", "lr", "recompute", "pipeline", "microbatches")
#: The mesh axis pipeline stages split the layers along (`shardlab.plan_pipeline`).
PIPELINE_AXIS = "pp"


def check_options(options: Mapping[str, Any], mesh: Mesh | None = None) -> None:
    """Raise a `StrategyError` naming the first option that is unknown or out of range (the
    pipeline options too, given the mesh: they need its `pp` axis)."""
    for key in options:
        if key not in OPTIONS:
            raise StrategyError(
                f"unknown strategy option {key!r}; options: {', '.join(OPTIONS)}", option=key
            )
    optimizer = options.get("optimizer", "adamw")
    if optimizer not in OPTIMIZERS:
        raise StrategyError(
            f"option 'optimizer' must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}",
            option="optimizer",
        )
    recompute = options.get("recompute", "none")
    if recompute not in POLICIES:
        raise StrategyError(
            f"option 'recompute' must be one of {', '.join(POLICIES)}, got {recompute!r}",
            option="recompute",
        )
    if "pipeline" in options and mesh is not None:
        if "pp" not in mesh.axis_names:
            raise StrategyError(
                f"option 'pipeline' applies to a mesh with a 'pp' axis; mesh {mesh} has none",
                option="pipeline",
            )
        PipelineOptions.from_options(options, mesh.axis_size("pp"))
    if "microbatches" in options:
        _check_accumulation(options["microbatches"], mesh)
    lr = options.get("lr", 1e-3)
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not 0 < lr < float("inf"):
        raise StrategyError(
            f"option 'lr' must be a positive number, got {lr!r}", option="lr", value=lr
        )


def _check_accumulation(microbatches: object, mesh: Mesh | None) -> None:
    """Option `microbatches` (gradient accumulation): a positive integer up to the limit the
    pipeline's micro-batches have, on a mesh without a `pp` axis (there the pipeline's own
    option counts them)."""
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise StrategyError(
            f"option 'microbatches' must be a positive integer, got {microbatches!r}",
            option="microbatches",
            value=repr(microbatches),
        )
    if microbatches > MAX_MICROBATCHES:
        raise StrategyError(
            f"option 'microbatches' is {microbatches}, more than the limit of {MAX_MICROBATCHES}",
            option="microbatches",
            limit=MAX_MICROBATCHES,
        )
    if mesh is not None and PIPELINE_AXIS in mesh.axis_names:
        raise StrategyError(
            f"option 'microbatches' accumulates gradients on a mesh without a 'pp' axis; mesh "
            f"{mesh} pipelines, and its micro-batches are the pipeline's: option pipeline "
            "{'microbatches': N} (--microbatches N)",
            option="microbatches",
        )


@dataclass(frozen=True, slots=True)
class Strategy:
    """Mesh + templates + annotations + options: everything completion needs."""

    mesh: Mesh
    templates: tuple[TemplateUse, ...] = ()
    annotations: tuple[Annotation, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        mesh: Mesh | str,
        templates: Sequence[str] = (),
        annotations: Sequence[str] = (),
        options: Mapping[str, Any] | None = None,
    ) -> Strategy:
        """From CLI-style text: `--mesh dp=2,tp=4 --template dp --annotate 'w=S(0)R'`."""
        mesh = Mesh.parse(mesh) if isinstance(mesh, str) else mesh
        uses = tuple(resolve_template(t, mesh) for t in templates)
        anns = tuple(Annotation.parse(a, mesh) for a in annotations)
        check_options(options or {}, mesh)
        return cls(mesh, uses, anns, dict(options or {}))

    @property
    def recompute(self) -> str:
        """The activation recomputation policy: none, selective or full."""
        return str(self.options.get("recompute", "none"))

    @property
    def accumulation(self) -> int:
        """Gradient accumulation: the micro-batches each rank runs one after another before
        one optimizer step (1: none). Only on a mesh without a `pp` axis; a pipeline's
        micro-batches are its option `pipeline`."""
        return int(self.options.get("microbatches", 1))

    def accumulating(self, microbatches: int | None) -> Strategy:
        """This strategy with gradient accumulation over `microbatches` (option
        `microbatches`, checked against the mesh); itself for None or 1."""
        if microbatches is None or microbatches == 1:
            return self
        options = {**self.options, "microbatches": microbatches}
        check_options(options, self.mesh)
        return Strategy(self.mesh, self.templates, self.annotations, options)

    @property
    def pipelined(self) -> bool:
        """Whether the plan runs a schedule of micro-batches: a `pp` axis, or accumulation."""
        return PIPELINE_AXIS in self.mesh.axis_names or self.accumulation > 1

    def schedule_strategy(self) -> Strategy:
        """The strategy the pipelined branch of the planner builds: this one on a mesh with a
        `pp` axis; with gradient accumulation, the same on the mesh with a leading `pp` axis
        of size 1 and `pipeline` {1f1b, `accumulation` micro-batches}. Accumulation is a
        pipeline of one stage: K forwards and backwards one after another, then one
        optimizer step; the stage's schedule, slot costs and runtimes are the pipeline's."""
        if self.accumulation <= 1 or PIPELINE_AXIS in self.mesh.axis_names:
            return self
        mesh = Mesh((1, *self.mesh.shape), (PIPELINE_AXIS, *self.mesh.axis_names),
                    self.mesh.ranks)  # fmt: skip
        options = {k: v for k, v in self.options.items() if k != "microbatches"}
        options["pipeline"] = {"schedule": "1f1b", "microbatches": self.accumulation}
        return Strategy(mesh, self.templates, self.annotations, options)

    def to_json(self) -> dict[str, Any]:
        return {
            "mesh": self.mesh.to_json(),
            "templates": [{"name": t.name, "axis": t.axis} for t in self.templates],
            "annotations": [a.to_json() for a in self.annotations],
            "options": self.options,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Strategy:
        """The strategy `to_json` wrote (errors name the bad template, annotation or option)."""
        if not isinstance(data, Mapping) or "mesh" not in data:
            raise StrategyError("a strategy must be an object with a 'mesh'")
        raw_mesh = data["mesh"]
        mesh = Mesh.parse(raw_mesh) if isinstance(raw_mesh, str) else Mesh.from_json(raw_mesh)
        uses = []
        for t in data.get("templates", []):
            text = t if isinstance(t, str) else f"{t.get('name')}:{t.get('axis')}"
            uses.append(resolve_template(text, mesh))
        anns = []
        for a in data.get("annotations", []):
            anns.append(
                Annotation.parse(a, mesh) if isinstance(a, str) else Annotation.from_json(a, mesh)
            )
        options = data.get("options", {})
        if not isinstance(options, Mapping):
            raise StrategyError("strategy 'options' must be an object")
        check_options(options, mesh)
        return cls(mesh, tuple(uses), tuple(anns), dict(options))

    def describe(self) -> str:
        parts = [f"mesh {self.mesh}"]
        parts += [f"template {t}" for t in self.templates]
        parts += [f"annotate {a.text()}" for a in self.annotations]
        if self.accumulation > 1:
            parts.append(f"{self.accumulation} micro-batches accumulated")
        return "; ".join(parts)
