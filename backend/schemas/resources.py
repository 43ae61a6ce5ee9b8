"""Request and response schemas of models, strategies and clusters.

Requests forbid unknown fields (a typo is a 422 naming it); responses are what the routers
return, typed for the OpenAPI document.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, model_validator

from backend.schemas.common import StrictRequest


def as_utc(moment: datetime) -> datetime:
    """A timestamp in UTC; naive ones (SQLite returns those) are UTC already."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


#: Timestamps are answered in UTC with an offset, from SQLite and PostgreSQL alike.
UtcDatetime = Annotated[datetime, AfterValidator(as_utc)]
NAME = Field(min_length=1, max_length=200, description="Unique within the team.")
MESH = Field(
    min_length=1,
    max_length=200,
    description="Mesh text form, e.g. 'dp=2,tp=4' (at most 8 axes and 2^20 devices).",
)


class RequestModel(StrictRequest):
    """Base of request bodies: unknown fields, loose types and control characters are
    refused (`StrictRequest`)."""


# -- models -------------------------------------------------------------------------------


class ModelCreate(RequestModel):
    """A model from a preset (`preset`, optional `overrides`) or from graph JSON (`graph`)."""

    name: str = NAME
    preset: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        description="Preset name, e.g. 'llama3-8b' (GET /api/presets).",
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="Preset settings to change, e.g. {'layers': 2}; only with 'preset'.",
    )
    graph: dict[str, Any] | None = Field(
        None, description="A graph document in the 'shardlab.graph/1' format (graph_to_json)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelCreate:
        if (self.preset is None) == (self.graph is None):
            raise ValueError("give exactly one of 'preset' (with 'overrides') or 'graph'")
        if self.graph is not None and self.overrides:
            raise ValueError("'overrides' apply to a preset only, not to 'graph'")
        return self


class ModelSummary(BaseModel):
    """The engine's `model_summary` of a stored graph."""

    name: str = Field(description="The graph's own name.")
    params: int = Field(description="Parameter elements.")
    param_bytes: int = Field(description="Bytes of the parameters in their dtypes.")
    flops_forward: int = Field(description="FLOPs of one forward execution.")
    layers: int = Field(description="Distinct `layers.N` scopes.")
    ops: int = Field(description="Ops of the serial graph.")
    values: int = Field(description="Values (tensors) of the graph.")
    ops_by_kind: dict[str, int] = Field(description="Op count per op kind.")
    inputs: dict[str, str] = Field(description="Input value -> type, e.g. 'int64[8,8]'.")
    outputs: list[str] = Field(description="Graph outputs.")
    config: dict[str, Any] = Field(description="The preset config the graph was built from.")


class ModelOut(BaseModel):
    """A stored model with its headline figures."""

    id: int
    name: str
    source: str = Field(description="preset | json | upload")
    preset: str | None = Field(description="The preset it was built from, if any.")
    overrides: dict[str, Any] = Field(description="Overrides applied to the preset.")
    params: int = Field(description="Parameter elements.")
    flops_forward: int = Field(description="FLOPs of one forward execution.")
    layers: int = Field(description="Distinct `layers.N` scopes.")
    ops: int = Field(description="Ops of the serial graph.")
    created_at: UtcDatetime


class ModelDetail(ModelOut):
    """A stored model with its full summary."""

    summary: ModelSummary


class ModuleNode(BaseModel):
    """A module of the graph view (see backend.module_tree)."""

    name: str = Field(description="Last path component, or `layers.*` for a folded list.")
    path: str = Field(description="Dot path; `*` stands for every repeat of a folded run.")
    ops: int = Field(description="Ops under the module (all repeats).")
    params: int = Field(description="Parameter elements under the module (all repeats).")
    repeat: int = Field(description="1, or the number of identical modules folded here.")
    children: list[ModuleNode] = Field(description="Sub-modules (of one repeat).")


# -- strategies ---------------------------------------------------------------------------


class StrategyCreate(RequestModel):
    """A named strategy: CLI-style text forms, validated by the engine."""

    name: str = NAME
    mesh: str = MESH
    templates: list[str] = Field(
        default_factory=list, description="Templates on mesh axes, e.g. ['megatron_tp:tp']."
    )
    annotations: list[str] = Field(
        default_factory=list, description="Annotations, e.g. ['tokens=dp:S(0)']."
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options: 'passes' (e.g. {'dp_overlap': false}), 'optimizer', 'lr', "
        "'recompute' ('none', 'selective' or 'full': activation recomputation) and, with a "
        "'pp' mesh axis, 'pipeline' ({'schedule': '1f1b', 'microbatches': 8, "
        "'virtual_stages': 2, 'balance': 'flops' or 'even'}).",
    )


class StrategyUpdate(RequestModel):
    """A new version of a strategy: the full definition (the name stays)."""

    mesh: str = MESH
    templates: list[str] = Field(default_factory=list, description="Templates on mesh axes.")
    annotations: list[str] = Field(default_factory=list, description="Annotations.")
    options: dict[str, Any] = Field(default_factory=dict, description="Options.")


class StrategyOut(BaseModel):
    """One version of a named strategy."""

    id: int
    name: str
    version: int = Field(description="1 for the first; each edit adds one.")
    mesh: str
    templates: list[str]
    annotations: list[str]
    options: dict[str, Any]
    created_at: UtcDatetime
    describe: str = Field(description="One-line description from the engine.")
    baseline_plans: list[dict[str, Any]] = Field(
        default_factory=list,
        description="After an edit: the plans of the new version queued against the "
        "baselines an earlier version made ({baseline, baseline_plan_id, plan_id, job_id}, or "
        "{baseline, error} where the new version cannot plan that model on that cluster).",
    )


# -- clusters -----------------------------------------------------------------------------


class ClusterCreate(RequestModel):
    """A team cluster: a spec in the cluster JSON format (its 'name' is set to `name`)."""

    name: str = Field(
        min_length=1, max_length=100, description="Unique among presets and the team's clusters."
    )
    spec: dict[str, Any] = Field(description="Cluster JSON, as the preset files hold.")


class ClusterOut(BaseModel):
    """A cluster's headline figures."""

    name: str
    source: str = Field(description="preset | user")
    description: str
    devices: int = Field(description="nodes x devices_per_node")
    nodes: int
    devices_per_node: int
    peak_flops_bf16: float | None = Field(description="Dense bfloat16 FLOP/s per device, if given.")
    hbm_bytes: float = Field(description="Device memory in bytes.")
    intra_node_bandwidth: float = Field(description="Bytes/s per device within a node.")
    inter_node_bandwidth: float = Field(description="Bytes/s per device across nodes.")


class ClusterDetail(ClusterOut):
    """A cluster with its full spec."""

    spec: dict[str, Any] = Field(description="The full cluster JSON.")
