"""Our sharding rules against PyTorch DTensor's sharding propagation, op by op.

A fake process group (4 ranks, no communication) lets one process build DTensors of every
rank's shape; DTensor runs the torch op and reports its output placements, and
`CommDebugMode` tells whether it redistributed an input first. The comparison is made where
both sides agree that the arriving placements need no reshard; cases where both reshard only
check that agreement. Intentional divergences are tested as such, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytest.importorskip("torch.distributed.tensor")

import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.distributed.tensor import Partial as TPartial  # noqa: E402
from torch.distributed.tensor import Replicate as TReplicate  # noqa: E402
from torch.distributed.tensor import Shard as TShard  # noqa: E402
from torch.distributed.tensor.debug import CommDebugMode  # noqa: E402
from torch.distributed.tensor.parallel import loss_parallel  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

from shardlab.ir import TensorType  # noqa: E402
from shardlab.mesh import Mesh  # noqa: E402
from shardlab.placement import (  # noqa: E402
    DistSpec,
    Placement,
    Replicate,
    Shard,
    local_shape,
    parse_placements,
)
from shardlab.spmd import RuleResult, infer, rule_for  # noqa: E402

LINE = Mesh((4,), ("x",))
GRID = Mesh((2, 2), ("dp", "tp"))


@dataclass(frozen=True)
class Outcome:
    """Both answers for one op: DTensor's output placements and comm count, and our rule."""

    torch_out: str
    torch_comms: int
    ours: RuleResult
    arriving: tuple[DistSpec, ...]

    @property
    def ours_out(self) -> str:
        return str(self.ours.output_specs[0])

    @property
    def ours_reshards(self) -> bool:
        return bool(self.ours.reshards(self.arriving))


@pytest.fixture(scope="module")
def torch_meshes() -> Iterator[dict[Mesh, Any]]:
    """A 4-rank fake process group for this module only, destroyed afterwards."""
    if dist.is_initialized():
        pytest.skip("a torch.distributed process group is already initialised")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        yield {
            LINE: DeviceMesh("cpu", torch.arange(4), mesh_dim_names=("x",)),
            GRID: DeviceMesh("cpu", torch.arange(4).reshape(2, 2), mesh_dim_names=("dp", "tp")),
        }
    finally:
        dist.destroy_process_group()


def to_torch(p: Placement) -> Any:
    if isinstance(p, Shard):
        return TShard(p.dim)
    if isinstance(p, Replicate):
        return TReplicate()
    return TPartial(p.op)


def from_torch(p: Any) -> str:
    """Our token for a DTensor placement; `SS(d)` for a strided shard, which we do not have."""
    if type(p).__name__ == "_StridedShard":
        return f"SS({p.dim})"
    if isinstance(p, TShard):
        return f"S({p.dim})"
    if isinstance(p, TReplicate):
        return "R"
    return f"P({p.reduce_op})"  # Partial and its subclasses (_MaskPartial: a masked sum)


#: An input: (global shape, placements text) or (shape, text, "int64") for integer ids.
Input = tuple[Any, ...]


@dataclass(frozen=True)
class Case:
    """One op application on both sides; the mesh follows the number of placements."""

    kind: str
    inputs: Sequence[Input]
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def mesh(self) -> Mesh:
        return LINE if len(parse_placements(self.inputs[0][1])) == 1 else GRID

    def __str__(self) -> str:
        attrs = ",".join(f"{k}={v}" for k, v in self.attrs.items())
        return f"{self.kind}({' '.join(str(x[1]) for x in self.inputs)}){attrs}"


def math_sdpa(q: Any, k: Any, v: Any) -> Any:
    """torch's sdpa on our [B, S, H, D] layout. The math backend decomposes into matmul and
    softmax, which DTensor shards; the fused CPU kernel has no DTensor strategy, and the
    causal math path builds a plain-tensor mask DTensor refuses, so only non-causal runs."""
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True
        )
    return out.transpose(1, 2)


def torch_call(kind: str, attrs: dict[str, Any]) -> Callable[..., Any]:
    """The torch function computing our op `kind` with `attrs`."""
    reduction = attrs.get("reduction", "mean")
    reduce_fn = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax}
    if kind in reduce_fn:
        dims, keep = attrs.get("dims"), bool(attrs.get("keepdim", False))
        return lambda x: reduce_fn[kind](x) if dims is None else reduce_fn[kind](x, dims, keep)
    calls: dict[str, Callable[..., Any]] = {
        "matmul": torch.matmul,
        "softmax": lambda x: torch.softmax(x, attrs.get("dim", -1)),
        "transpose": lambda x: x.transpose(attrs["dim0"], attrs["dim1"]),
        "permute": lambda x: x.permute(*attrs["perm"]),
        "reshape": lambda x: x.reshape(*attrs["shape"]),
        "embedding": F.embedding,
        "scaled_dot_product_attention": math_sdpa,
        "mse_loss": lambda a, b: F.mse_loss(a, b, reduction=reduction),
        "cross_entropy": lambda a, b: F.cross_entropy(a, b, reduction=reduction),
    }
    return calls[kind] if kind in calls else getattr(torch, kind)  # add, mul, neg, relu


def run_case(
    case: Case, torch_meshes: dict[Mesh, Any], fn: Callable[..., Any] | None = None
) -> Outcome:
    if rule_for(case.kind)[1]:
        pytest.skip(f"{case.kind} has no sharding rule yet")
    mesh = case.mesh
    xs, specs, types = [], [], []
    for shape, text, *dtype in case.inputs:
        spec = DistSpec(mesh, parse_placements(text, mesh))
        local = local_shape(shape, mesh, spec.placements)
        is_int = dtype == [INT]
        data = torch.randint(0, 4, local) if is_int else torch.randn(local, dtype=torch.float64)
        xs.append(
            DTensor.from_local(
                data,
                torch_meshes[mesh],
                [to_torch(p) for p in spec.placements],
                run_check=False,
                shape=torch.Size(shape),
                stride=torch.empty(shape).stride(),
            )
        )
        specs.append(spec)
        types.append(TensorType(tuple(shape), INT if is_int else "float32"))
    with CommDebugMode() as comms:
        out = (fn or torch_call(case.kind, case.attrs))(*xs)
    ours = infer(case.kind, types, specs, case.attrs, mesh)
    assert not ours.fallback
    torch_out = "".join(from_torch(p) for p in out.placements)
    return Outcome(torch_out, comms.get_total_counts(), ours, tuple(specs))


INT = "int64"
M8, NC = (8, 8), {"causal": False}
Q, KV, Q4 = (2, 8, 4, 4), (2, 8, 2, 4), (4, 8, 4, 4)
SDPA = "scaled_dot_product_attention"

#: Both sides keep the arriving placements and agree on the output placements.
AGREE = [
    Case("matmul", [(M8, "S(1)"), (M8, "S(0)")]),  # -> P(sum)
    Case("matmul", [(M8, "S(0)"), (M8, "R")]),  # -> S(0)
    Case("matmul", [(M8, "R"), (M8, "S(1)")]),  # -> S(1)
    Case("matmul", [(M8, "P(sum)"), (M8, "R")]),  # -> P(sum)
    Case("matmul", [((4, 8, 8), "S(0)"), ((4, 8, 8), "S(0)")]),
    Case("add", [(M8, "P(sum)"), (M8, "P(sum)")]),  # -> P(sum)
    Case("add", [(M8, "S(0)"), (M8, "S(0)")]),
    Case("add", [(M8, "S(0)"), ((8,), "R")]),  # broadcasting
    Case("mul", [(M8, "S(1)"), ((8,), "S(0)")]),  # broadcasting
    Case("mul", [(M8, "P(sum)"), (M8, "R")]),
    Case("neg", [(M8, "P(sum)")]),
    Case("relu", [(M8, "S(1)")]),
    Case("sum", [(M8, "S(1)")], {"dims": [1]}),  # over the sharded dim -> P(sum)
    Case("sum", [(M8, "S(1)")], {"dims": [0]}),  # -> S(0)
    Case("sum", [(M8, "S(1)")], {"dims": [1], "keepdim": True}),
    Case("sum", [(M8, "S(0)")]),
    Case("mean", [(M8, "S(1)")], {"dims": [1]}),  # -> P(avg)
    Case("max", [(M8, "S(1)")], {"dims": [1]}),  # -> P(max)
    Case("softmax", [(M8, "S(0)")], {"dim": -1}),
    Case("transpose", [((8, 4), "S(0)")], {"dim0": 0, "dim1": 1}),
    Case("permute", [((4, 4, 8), "S(2)")], {"perm": [2, 0, 1]}),
    Case("reshape", [((8, 4), "S(0)")], {"shape": [32]}),  # merges, outer dim sharded
    Case("reshape", [((32,), "S(0)")], {"shape": [8, 4]}),  # splits
    Case("reshape", [((2, 4, 8), "S(2)")], {"shape": [2, 4, 4, 2]}),
    Case("embedding", [((2, 4), "R", INT), ((16, 8), "S(1)")]),  # hidden sharded
    Case("embedding", [((2, 4), "R", INT), ((1024, 8), "S(0)")]),  # vocab parallel -> P(sum)
    Case("embedding", [((4, 4), "S(0)", INT), ((16, 8), "R")]),
    Case(SDPA, [(Q, "S(2)")] * 3, NC),  # heads
    Case(SDPA, [(Q4, "S(0)")] * 3, NC),  # batch
    Case(SDPA, [(Q, "S(1)"), (Q, "R"), (Q, "R")], NC),  # query sequence
    Case("mse_loss", [(M8, "S(0)")] * 2),  # -> P(avg)
    Case("mse_loss", [(M8, "S(0)")] * 2, {"reduction": "sum"}),  # -> P(sum)
    Case("cross_entropy", [(M8, "S(0)"), ((8,), "S(0)", INT)]),  # -> P(avg)
    Case("cross_entropy", [(M8, "S(0)"), ((8,), "S(0)", INT)], {"reduction": "sum"}),
    # 2-D mesh
    Case("matmul", [(M8, "S(0)S(1)"), (M8, "RS(0)")]),  # -> S(0)P(sum)
    Case("matmul", [(M8, "S(0)R"), (M8, "RS(1)")]),  # -> S(0)S(1)
    Case("add", [(M8, "S(0)P(sum)"), (M8, "S(0)P(sum)")]),
    Case("mul", [((4, 8, 8), "S(0)S(2)"), ((8,), "RS(0)")]),
    Case("sum", [(M8, "S(0)S(1)")], {"dims": [1]}),
    Case("transpose", [(M8, "S(0)S(1)")], {"dim0": 0, "dim1": 1}),
    Case("reshape", [(M8, "S(0)S(0)")], {"shape": [64]}),
    Case("embedding", [((4, 4), "S(0)R", INT), ((1024, 8), "RS(0)")]),
    Case(SDPA, [(Q, "S(0)S(2)"), (KV, "S(0)S(2)"), (KV, "S(0)S(2)")], NC),  # GQA heads
]

#: Both sides reshard the input first (a non-linear op on a partial or on its reduced dim).
BOTH_RESHARD = [
    Case("relu", [(M8, "P(sum)")]),
    Case("softmax", [(M8, "S(1)")], {"dim": -1}),
]


@pytest.mark.parametrize("case", AGREE, ids=str)
def test_same_output_placements(case: Case, torch_meshes: dict[Mesh, Any]) -> None:
    got = run_case(case, torch_meshes)
    assert got.torch_comms == 0 and not got.ours_reshards, (got.torch_comms, got.ours.reason)
    assert got.ours_out == got.torch_out, got.ours.reason


@pytest.mark.parametrize("case", BOTH_RESHARD, ids=str)
def test_both_reshard(case: Case, torch_meshes: dict[Mesh, Any]) -> None:
    got = run_case(case, torch_meshes)
    assert got.torch_comms > 0 and got.ours_reshards


# -- intentional divergences ------------------------------------------------------------


def test_view_merging_an_inner_sharded_dim(torch_meshes: dict[Mesh, Any]) -> None:
    """DTensor describes [8, 4] S(1) viewed as [32] with a strided shard (every rank holds
    interleaved pieces, no data moves). Our placements have no strided shard (a block per
    rank is what the cost model, lowering and exports assume), so we move the shard to the
    group's outer dim first (one all_to_all; a gather would move n times the bytes)."""
    for shape, text, ours_in in (((8, 4), "S(1)", "S(0)"), (M8, "S(0)S(1)", "S(0)S(0)")):
        got = run_case(Case("reshape", [(shape, text)], {"shape": [-1]}), torch_meshes)
        assert got.torch_comms == 0 and "SS(0)" in got.torch_out
        assert got.ours_reshards and str(got.ours.input_specs[0]) == ours_in


def test_embedding_of_a_partial_table(torch_meshes: dict[Mesh, Any]) -> None:
    """DTensor's embedding strategy does not accept a partial weight and reduce-scatters it;
    a lookup is linear in the table, so ours passes the partial sums through (no comm)."""
    got = run_case(Case("embedding", [((4, 4), "R", INT), ((16, 8), "P(sum)")]), torch_meshes)
    assert got.torch_comms > 0 and got.torch_out == "S(2)"
    assert not got.ours_reshards and got.ours_out == "P(sum)"


def test_vocab_parallel_cross_entropy(torch_meshes: dict[Mesh, Any]) -> None:
    """Under `loss_parallel`, DTensor all-reduces inside the op and returns a replicated loss;
    ours does the same three inner all-reduces (max, sum of exp, the target logit; listed
    as InnerComms) and returns it replicated too."""

    def parallel_ce(logits: Any, labels: Any) -> Any:
        with loss_parallel():
            return F.cross_entropy(logits, labels)

    case = Case("cross_entropy", [((8, 1024), "S(1)"), ((8,), "R", INT)])
    got = run_case(case, torch_meshes, parallel_ce)
    assert got.torch_comms > 0 and got.torch_out == "R"
    assert not got.ours_reshards and got.ours_out == "R"
    assert [c.op for c in got.ours.inner_comms] == ["max", "sum", "sum"]
    assert got.torch_comms == len(got.ours.inner_comms)
