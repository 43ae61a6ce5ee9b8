"""The export formats of a plan, by name: what the CLI and the service's export route call.

What it is for: one table of formats (`EXPORTS`), so `shardlab export-plan --format F` and
`GET /api/plans/{id}/export?format=F` offer the same files with the same names:

- `dtensor`: a Python module, `parallelize(model, world_mesh=None)` (`export.dtensor`);
- `torchtitan`: the `[parallelism]` and `[activation_checkpoint]` TOML (`export.torchtitan`);
- `json`: every parameter's placements (`export.placements_json.parameter_placements`).

`export_plan(plan, format)` returns the file's text, media type, a file name and the notes
the user should read (what the export cannot say exactly, e.g. ZeRO-1/2). `rebuild_plan`
rebuilds the plan a stored plan artifact (`Plan.to_json()`) describes, as the service needs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardlab.cost.clusters import cluster_from_dict
from shardlab.export.dtensor import derive_export, render_dtensor
from shardlab.export.parameters import PIPELINE_AXIS, ExportError
from shardlab.export.placements_json import parameter_placements
from shardlab.export.torchtitan import render_torchtitan
from shardlab.graph_json import graph_from_json
from shardlab.plan import Plan, build_plan
from shardlab.strategy import Strategy


@dataclass(frozen=True, slots=True)
class ExportFormat:
    name: str
    media_type: str
    suffix: str
    description: str
    render: Callable[[Plan], str]


def _json(plan: Plan) -> str:
    return json.dumps(parameter_placements(plan), indent=1) + "\n"


EXPORTS: dict[str, ExportFormat] = {
    f.name: f
    for f in (
        ExportFormat("dtensor", "text/x-python", "_parallelize.py",
                     "DTensor parallelize module", render_dtensor),
        ExportFormat("torchtitan", "application/toml", "_torchtitan.toml",
                     "torchtitan parallelism config", render_torchtitan),
        ExportFormat("json", "application/json", "_placements.json",
                     "parameter placements JSON", _json),
    )
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ExportedFile:
    text: str
    media_type: str
    filename: str
    notes: tuple[str, ...]


def export_format(name: str) -> ExportFormat:
    """The format called `name`, or an ExportError naming it and the formats there are."""
    found = EXPORTS.get(name)
    if found is None:
        raise ExportError(
            f"unknown export format {name!r}; formats: {', '.join(EXPORTS)}", format=name
        )
    return found


def export_plan(plan: Plan, name: str, stem: str | None = None) -> ExportedFile:
    """`plan` written as format `name`; the file is named `<stem><suffix>` (stem: the model's
    name, made safe for a file name)."""
    fmt = export_format(name)
    text = fmt.render(plan)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", stem or plan.model.name or "plan").strip("._") or "plan"
    return ExportedFile(text, fmt.media_type, safe + fmt.suffix, tuple(derive_export(plan).notes))


def rebuild_plan(data: dict[str, Any]) -> Plan:
    """The plan a stored `Plan.to_json()` describes, rebuilt for exporting: completed and
    lowered, without passes or cost (placements do not depend on them); a pipelined plan
    keeps its cluster, which may balance its stages. Errors name the missing field."""
    for key in ("model", "strategy", "optimizer"):
        if key not in data:
            raise ExportError(f"the stored plan has no field {key!r}", field=key)
    strategy = Strategy.from_json(data["strategy"])
    pipelined = PIPELINE_AXIS in strategy.mesh.axis_names and data.get("cluster")
    return build_plan(
        graph_from_json(data["model"]),
        strategy,
        optimizer=str(data["optimizer"]),
        lr=float(data.get("lr", 1e-3)),
        cluster=cluster_from_dict(data["cluster"]) if pipelined else None,
        passes=False,
    )
