"""The export formats of a plan, by name: what the CLI and the service's export route call.

What it is for: one table of formats (`EXPORTS`), so `shardlab export-plan --format F` and
`GET /api/plans/{id}/export?format=F` offer the same files with the same names:

- `dtensor`: a Python module, `parallelize(model, world_mesh=None)` (`export.dtensor`);
- `torchtitan`: torchtitan 0.3's command line, one option a line (`export.torchtitan`);
- `torchtitan-toml`: the `[parallelism]` and `[activation_checkpoint]` TOML of torchtitan
  before 0.3 (`export.torchtitan_toml`);
- `megatron`: Megatron-LM's `pretrain_gpt.py` arguments (`export.megatron`);
- `json`: every parameter's placements (`export.placements_json.parameter_placements`).

`export_plan(plan, format)` returns the file's text, media type, a file name and the notes
the user should read (what the format cannot say exactly, e.g. ZeRO-1/2, and what it maps
to what its framework runs). `rebuild_plan`
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
from shardlab.export.megatron import megatron_run
from shardlab.export.parameters import PIPELINE_AXIS, ExportError
from shardlab.export.placements_json import parameter_placements
from shardlab.export.torchtitan import torchtitan_run
from shardlab.export.torchtitan_toml import render_torchtitan_toml
from shardlab.graph_json import graph_from_json
from shardlab.plan import Plan, build_plan
from shardlab.strategy import Strategy


@dataclass(frozen=True, slots=True)
class ExportFormat:
    name: str
    media_type: str
    suffix: str
    description: str
    #: the file's text and the notes the user should read
    render: Callable[[Plan], tuple[str, list[str]]]


def _json(plan: Plan) -> tuple[str, list[str]]:
    return json.dumps(parameter_placements(plan), indent=1) + "\n", derive_export(plan).notes


def _dtensor(plan: Plan) -> tuple[str, list[str]]:
    return render_dtensor(plan), derive_export(plan).notes


def _torchtitan(plan: Plan) -> tuple[str, list[str]]:
    run = torchtitan_run(plan)
    return run.text(), run.notes


def _torchtitan_toml(plan: Plan) -> tuple[str, list[str]]:
    return render_torchtitan_toml(plan), derive_export(plan).notes


def _megatron(plan: Plan) -> tuple[str, list[str]]:
    run = megatron_run(plan)
    return run.text(), run.notes


EXPORTS: dict[str, ExportFormat] = {
    f.name: f
    for f in (
        ExportFormat("dtensor", "text/x-python", "_parallelize.py",
                     "DTensor parallelize module", _dtensor),
        ExportFormat("torchtitan", "text/plain", "_torchtitan.args",
                     "torchtitan 0.3 command-line arguments", _torchtitan),
        ExportFormat("torchtitan-toml", "application/toml", "_torchtitan.toml",
                     "torchtitan config TOML (before 0.3)", _torchtitan_toml),
        ExportFormat("megatron", "text/plain", "_megatron.args",
                     "Megatron-LM pretrain_gpt.py arguments", _megatron),
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
    text, notes = fmt.render(plan)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", stem or plan.model.name or "plan").strip("._") or "plan"
    return ExportedFile(text, fmt.media_type, safe + fmt.suffix, tuple(notes))


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
