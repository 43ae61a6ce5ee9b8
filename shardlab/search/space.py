"""The space a strategy search walks: meshes, templates, recomputation and schedules.

A `Candidate` is one point: a mesh `pp x dp x tp` over the devices (tensor parallelism
innermost, so a tp group sits inside a node), a data-parallel recipe (`dp`, `zero1`, `zero2`,
`fsdp`, and `hsdp` where dp spans nodes: `dpr x dps`), Megatron tensor parallelism with or
without sequence parallelism, a recomputation policy and, with pipeline stages, a schedule,
a micro-batch count and virtual stages.

`meshes` lists every factorization of the device count and prunes those that cannot run,
each with one line saying why ("tp=16 crosses nodes (8 GPUs per node)"); `base_candidates`
lists the recipes first tried on one mesh and `leaner` what to try when one does not fit.
Memory is judged later, by the cost model.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from shardlab.strategy import Strategy

#: Data-parallel recipes, from the cheapest in time to the leanest in memory.
DP_RECIPES = ("dp", "zero1", "zero2", "fsdp")
#: Hybrid sharded data parallelism (torchtitan's HSDP, FSDP2 on a 2-D mesh): parameters,
#: gradients and states sharded over the `dps` ranks of a node, replicated over `dpr`
#: across nodes; tried where the data-parallel ranks span several nodes (`hsdp_shard`).
HSDP = "hsdp"
#: The recipes that gather parameters before each use (their pipelined units are longer).
GATHERING = ("fsdp", HSDP)
#: Recomputation policies, from the fastest to the leanest.
RECOMPUTE = ("none", "selective", "full")
#: Micro-batches per step tried for a pipeline, as multiples of its stages.
MICROBATCH_FACTORS = (1, 2, 4, 8)


@dataclass(frozen=True)
class ModelShape:
    """What the search must know of a model: its layers, heads and the global batch."""

    layers: int
    heads: int
    kv_heads: int
    batch: int  # the global batch, in sequences
    #: attention runs as one fused (flash) kernel, which never stores the [b, a, s, s]
    #: tensors selective recomputation drops: there it saves nothing and costs the kernel
    #: again, so the search goes from no recomputation straight to full
    fused_attention: bool = False


@dataclass(frozen=True)
class Limits:
    """The user's constraints on the space."""

    gpus: int
    devices_per_node: int
    max_tp: int | None = None
    min_dp: int = 1
    cross_node_tp: bool = False


@dataclass(frozen=True, order=True)
class Mesh3:
    """A factorization of the devices: pipeline stages, data replicas, tensor shards."""

    pp: int
    dp: int
    tp: int

    def text(self) -> str:
        """The mesh as `shardlab plan --mesh` takes it (axes of size 1 left out)."""
        axes = [f"{name}={n}" for name, n in (("pp", self.pp), ("dp", self.dp), ("tp", self.tp))
                if n > 1]  # fmt: skip
        return ",".join(axes) or "dp=1"


@dataclass(frozen=True)
class Candidate:
    """One strategy the search evaluates."""

    mesh: Mesh3
    dp_recipe: str | None  # one of DP_RECIPES, None without data parallelism
    sequence_parallel: bool
    recompute: str
    schedule: str | None = None
    microbatches: int | None = None
    virtual_stages: int | None = None
    #: per-op placements found by the layer's integer program (`refine`), applied on top of
    #: the templates; empty for a template combination
    annotations: tuple[str, ...] = ()
    #: HSDP: the data-parallel ranks that shard the states (`dps`; the others replicate)
    shard: int | None = None

    @property
    def state_shards(self) -> int:
        """How many ranks share one copy of the parameters' states: `dps` under HSDP, else
        the data-parallel ranks (a recipe that shards nothing ignores it)."""
        return self.shard if self.dp_recipe == HSDP and self.shard else self.mesh.dp

    def templates(self) -> list[str]:
        """The batch is sharded by `dp`; a ZeRO or FSDP recipe composes with it (alone,
        `zero1` shards the optimizer state of replicas that all run the whole batch).
        HSDP: `dp` on the replicas' axis `dpr`, `fsdp` on the shards' axis `dps`."""
        out = []
        if self.dp_recipe == HSDP:
            out = ["dp:dpr", "fsdp:dps"]
        elif self.dp_recipe:
            out = ["dp"] if self.dp_recipe == "dp" else ["dp", self.dp_recipe]
        if self.mesh.tp > 1:
            out.append("megatron_tp")
            if self.sequence_parallel:
                out.append("sequence_parallel")
        return out

    @property
    def accumulates(self) -> bool:
        """Gradient accumulation: no pipeline stages, the batch cut into micro-batches run
        one after another, one optimizer step (strategy option `microbatches`)."""
        return self.mesh.pp == 1 and bool(self.microbatches) and self.microbatches != 1

    def mesh_text(self) -> str:
        """The mesh as the strategy takes it (HSDP: `dp` as `dpr=R,dps=S`)."""
        if self.dp_recipe != HSDP or not self.shard:
            return self.mesh.text()
        m = self.mesh
        axes = [f"pp={m.pp}"] if m.pp > 1 else []
        axes += [f"dpr={m.dp // self.shard}", f"dps={self.shard}"]
        return ",".join(axes + ([f"tp={m.tp}"] if m.tp > 1 else []))

    def options(self) -> dict[str, Any]:
        out: dict[str, Any] = {"recompute": self.recompute}
        if self.accumulates:
            out["microbatches"] = self.microbatches
        elif self.mesh.pp > 1:
            pipeline: dict[str, Any] = {
                "schedule": self.schedule,
                "microbatches": self.microbatches,
                "balance": "time",  # stages balanced by predicted time (pipeline_stages)
            }
            if self.virtual_stages:
                pipeline["virtual_stages"] = self.virtual_stages
            out["pipeline"] = pipeline
        return out

    def strategy(self) -> Strategy:
        return Strategy.build(
            self.mesh_text(), self.templates(), self.annotations, options=self.options()
        )

    def label(self) -> str:
        """`pp=2,dp=4,tp=8 zero1+megatron_tp+sequence_parallel, 1f1b x16, recompute selective`."""
        text = f"{self.mesh_text()} {'+'.join(self.templates()) or 'no template'}"
        if self.mesh.pp > 1:
            text += f", {self.schedule} x{self.microbatches}"
            if self.virtual_stages and self.virtual_stages > 1:
                text += f" v={self.virtual_stages}"
        if self.accumulates:
            text += f", {self.microbatches} micro-batches accumulated"
        if self.recompute != "none":
            text += f", recompute {self.recompute}"
        if self.annotations:
            text += " + per-op ILP"
        return text

    def to_json(self) -> dict[str, Any]:
        """The plan inputs: enough to build this candidate as a stored plan."""
        return {
            "mesh": self.mesh_text(),
            "templates": self.templates(),
            "recompute": self.recompute,
            "schedule": self.schedule,
            "microbatches": self.microbatches,
            "virtual_stages": self.virtual_stages,
            "annotations": list(self.annotations),
            "options": self.options(),
        }


@dataclass(frozen=True)
class Pruned:
    """A point of the space left out, and why (one line)."""

    what: str
    reason: str
    #: the memory per rank it needs at least, where memory ruled it out before planning
    least_bytes: float | None = None

    def to_json(self) -> dict[str, str]:
        return {"candidate": self.what, "reason": self.reason}


@dataclass
class Space:
    """The meshes that can run, and those pruned with their reasons."""

    meshes: list[Mesh3] = field(default_factory=list)
    pruned: list[Pruned] = field(default_factory=list)


def meshes(shape: ModelShape, limits: Limits) -> Space:
    """Every pp x dp x tp factorization of the devices, kept or pruned (module docstring)."""
    space = Space()
    n = limits.gpus
    for tp in _divisors(n):
        for pp in _divisors(n // tp):
            mesh = Mesh3(pp, n // (tp * pp), tp)
            why = _why_not(mesh, shape, limits)
            if why:
                space.pruned.append(Pruned(mesh.text(), why))
            else:
                space.meshes.append(mesh)
    return space


def _why_not(mesh: Mesh3, shape: ModelShape, limits: Limits) -> str | None:
    if mesh.tp > limits.devices_per_node and not limits.cross_node_tp:
        return f"tp={mesh.tp} crosses nodes ({limits.devices_per_node} GPUs per node)"
    if limits.max_tp is not None and mesh.tp > limits.max_tp:
        return f"tp={mesh.tp} is above --max-tp {limits.max_tp}"
    if mesh.dp < limits.min_dp:
        return f"dp={mesh.dp} is below --min-dp {limits.min_dp}"
    if shape.heads % mesh.tp:
        return f"tp={mesh.tp} does not divide the {shape.heads} attention heads"
    if mesh.pp > shape.layers:
        return f"pp={mesh.pp} is more stages than the {shape.layers} layers"
    if shape.batch % mesh.dp:
        return f"the global batch {shape.batch} does not split over dp={mesh.dp}"
    if mesh.pp > 1 and not _microbatch_counts(mesh, shape):
        return (f"pp={mesh.pp} needs at least {mesh.pp} micro-batches; the batch per replica "
                f"is {shape.batch // mesh.dp}")  # fmt: skip
    return None


def schedules(mesh: Mesh3, shape: ModelShape) -> list[tuple[str | None, int | None, int | None]]:
    """(schedule, micro-batches, virtual stages) worth trying on `mesh`: none without stages;
    else 1F1B at each micro-batch count, and interleaved with 2 chunks per stage where the
    layers split into 2 x pp chunks."""
    if mesh.pp == 1:
        return [(None, None, None)]
    out: list[tuple[str | None, int | None, int | None]] = []
    for m in _microbatch_counts(mesh, shape):
        out.append(("1f1b", m, None))
        if shape.layers % (2 * mesh.pp) == 0:
            out.append(("interleaved", m, 2))
    return out


def _microbatch_counts(mesh: Mesh3, shape: ModelShape) -> list[int]:
    per_replica = shape.batch // mesh.dp
    return [mesh.pp * f for f in MICROBATCH_FACTORS if per_replica % (mesh.pp * f) == 0]


def hsdp_shard(mesh: Mesh3, devices_per_node: int) -> int | None:
    """The `dps` of HSDP on `mesh`: the data-parallel ranks of one node (a node's devices
    over tp), where the data-parallel ranks span several nodes; None where HSDP would be
    FSDP (all in one node) or the node's ranks do not divide them, and on meshes with
    pipeline stages (tried there, HSDP added half again to a 384-GPU search's time; its
    use is scaling data parallelism out without stages)."""
    if mesh.pp > 1 or mesh.tp > devices_per_node or devices_per_node % mesh.tp:
        return None
    shard = devices_per_node // mesh.tp
    return shard if 1 < shard < mesh.dp and mesh.dp % shard == 0 else None


def base_candidates(
    mesh: Mesh3, plan: tuple[str | None, int | None, int | None], devices_per_node: int = 0
) -> list[Candidate]:
    """The recipes planned first on a mesh, all without recomputation: every data-parallel
    recipe (no one of them always wins: FSDP's sharded optimizer step and overlapped gathers
    can beat plain data parallelism even when both fit), HSDP where the data-parallel ranks
    span nodes of `devices_per_node` (`hsdp_shard`), and with tensor parallelism both with
    and without sequence parallelism (it divides activation memory by tp for the same
    bytes, but its extra collectives can cost more than they save at small shapes)."""
    schedule, m, v = plan
    recipes: tuple[str | None, ...] = DP_RECIPES if mesh.dp > 1 else (None,)
    sps = (True, False) if mesh.tp > 1 else (False,)
    out = [Candidate(mesh, dp, sp, "none", schedule, m, v) for sp in sps for dp in recipes]
    shard = hsdp_shard(mesh, devices_per_node) if devices_per_node else None
    if shard is not None:
        out += [Candidate(mesh, HSDP, sp, "none", schedule, m, v, shard=shard) for sp in sps]
    return out


def leaner(candidate: Candidate, shape: ModelShape | None = None) -> list[Candidate]:
    """The next steps down in memory from `candidate`: more recomputation (full straight
    after none where the model's attention is fused, `ModelShape.fused_attention`), and
    without pipeline stages twice the micro-batches of gradient accumulation (given the
    model's `shape`, where the batch per replica divides). Each costs some time; the search
    tries them when memory asks."""
    j = RECOMPUTE.index(candidate.recompute)
    fused = shape is not None and shape.fused_attention
    policies = [r for r in RECOMPUTE[j + 1 :] if not (fused and r == "selective")]
    out = [replace(candidate, recompute=r) for r in policies][:1]
    if shape is not None and candidate.mesh.pp == 1:
        m = 2 * (candidate.microbatches or 1)
        if m <= max(MICROBATCH_FACTORS) and (shape.batch // candidate.mesh.dp) % m == 0:
            out.append(replace(candidate, schedule="1f1b", microbatches=m))
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def every_candidate(shape: ModelShape, limits: Limits) -> list[Candidate]:
    """The whole space: every recipe on every mesh and schedule (data-parallel recipe x
    sequence parallelism x recomputation; without pipeline stages, gradient accumulation over
    2, 4 and 8 micro-batches too), for checking the search against an exhaustive walk on
    spaces small enough to walk."""
    out = []
    for mesh in meshes(shape, limits).meshes:
        recipes: tuple[str | None, ...] = DP_RECIPES if mesh.dp > 1 else (None,)
        sps = (True, False) if mesh.tp > 1 else (False,)
        plans = schedules(mesh, shape)
        if mesh.pp == 1:
            per_replica = shape.batch // mesh.dp
            plans += [("1f1b", m, None) for m in MICROBATCH_FACTORS[1:] if per_replica % m == 0]
        shard = hsdp_shard(mesh, limits.devices_per_node)
        for plan in plans:
            for dp, sp, rc in itertools.product(recipes, sps, RECOMPUTE):
                out.append(Candidate(mesh, dp, sp, rc, *plan))
            if shard is not None:
                out += [Candidate(mesh, HSDP, sp, rc, *plan, shard=shard)
                        for sp, rc in itertools.product(sps, RECOMPUTE)]  # fmt: skip
    return out
