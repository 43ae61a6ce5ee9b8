"""The ops compared with DTensor (`dtensor_parity`): our op, its shapes, the torch code.

Every dim divides by 4, so each dim can be sharded over both mesh axes. `SCALES`: "toy"
(activations [B, S, H] = [4, 8, 16], heads [B, S, N, D] = [4, 8, 4, 4]: a few KiB, so the
fixed latency of a collective, 64 KiB in our cost model, outweighs any byte count) and
"large" (S x32, H x64: per-rank blocks of about 1 MiB, where bytes decide). Weights are in
our layout (linear [in, out]); `Operand.perm` gives torch's ([out, in] for F.linear).
`quick` keeps every arriving placement of the activation input(s) and a few of the
parameters', so the test stays fast; the bench runs every combination.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tests.shardlab.spmd.dtensor_parity import INT, Operand, ParityCase

aten = torch.ops.aten
#: B, S, H, N (heads), D (head dim), FF (linear out), V (vocab).
SCALES = {"toy": (4, 8, 16, 4, 4, 32, 32), "large": (4, 256, 1024, 4, 256, 2048, 2048)}
EPS = 1e-6
BSHD = (0, 2, 1, 3)  # our attention layout [B, S, H, D] <-> torch's [B, H, S, D]


def _sdpa_args(specs: list[Any]) -> tuple[Any, ...]:
    return (*specs, 0.0, False, False)  # dropout_p, is_causal, return_debug_mask


def _case(
    name: str,
    family: str,
    kind: str,
    operands: tuple[Operand, ...],
    fn: Callable[..., Any] | None = None,
    **kw: Any,
) -> ParityCase:
    return ParityCase(name, family, kind, operands, torch_fn=fn, **kw)


def all_cases(quick: bool = False, scale: str = "toy") -> list[ParityCase]:
    """Every case of the comparison; `quick`: fewer parameter placements (see module doc)."""
    B, S, H, N, D, FF, V = SCALES[scale]

    def rms_args(specs: list[Any]) -> tuple[Any, ...]:
        return (specs[0], [H], specs[1], EPS)

    def some(*texts: str) -> tuple[str, ...] | None:
        return texts if quick else None

    x = Operand((B, S, H))
    x4 = Operand((B, S, N, D))
    w = Operand((H, FF), perm=(1, 0), only=some("RR", "RS(0)", "RS(1)", "S(0)R"))
    wb = Operand((H, FF), perm=(1, 0), only=some("RR", "RS(1)"))
    bias = Operand((FF,), only=some("RR", "RS(0)"))
    other = Operand((B, S, H), only=some("RR", "RS(2)", "S(0)R", "S(0)S(1)", "P(sum)R"))
    vec = Operand((H,), only=some("RR", "RS(0)", "S(0)R", "P(sum)R", "RP(sum)"))
    gamma = Operand((H,), only=some("RR", "RS(0)", "P(sum)R"))
    beta = Operand((H,), only=gamma.only, tie=1 if quick else None)
    mm_b = Operand((H, S), only=some("RR", "RS(1)", "S(0)R", "RP(sum)"))
    mm_bt = Operand((S, H), only=mm_b.only)
    # quick: no S(1) on a 4-D operand; DTensor merges the batch dims [B, N] for bmm, a
    # sharded N becomes a _StridedShard and its graph-based planner takes seconds per case
    no_s1 = ("R", "S(0)", "S(2)", "S(3)", "P(sum)")
    m4 = Operand((B, N, S, S), only=some(*(a + b for a in no_s1 for b in no_s1)))
    k = Operand((B, S, N, D), perm=BSHD, only=some("RR", "S(0)S(2)", "RS(2)", "S(1)R", "P(sum)R"))
    q = Operand((B, S, N, D), perm=BSHD)
    v = Operand((B, S, N, D), perm=BSHD, tie=1)  # v arrives like k
    ids = Operand((B, S), INT)
    table = Operand((V, H))

    def reduce(name: str, fn: Callable[..., Any], dim: int) -> ParityCase:
        kind = name.split("_")[0]
        return _case(name, "reduce", kind, (x,), lambda t: fn(t, dim), attrs={"dims": [dim]})

    def reshape(name: str, src: Operand, shape: tuple[int, ...]) -> ParityCase:
        attrs = {"shape": list(shape)}
        return _case(name, "reshape", "reshape", (src,), lambda t: t.reshape(shape), attrs=attrs)

    # fmt: off
    return [
        _case("linear", "linear", "linear", (x, w), F.linear),
        _case("linear_bias", "linear", "linear", (x, wb, bias), F.linear),
        _case("matmul_2d", "matmul", "matmul", (Operand((S, H)), mm_b), torch.matmul),
        _case("matmul_2d_tb", "matmul", "matmul", (Operand((S, H)), mm_bt),
              lambda a, b: torch.matmul(a, b.mT), attrs={"transpose_b": True}),
        _case("matmul_4d_tb", "matmul", "matmul", (m4, Operand(m4.shape, tie=0) if quick else m4),
              lambda a, b: torch.matmul(a, b.transpose(-1, -2)),
              attrs={"transpose_b": True}),
        _case("add", "elementwise", "add", (x, other), torch.add),
        _case("mul", "elementwise", "mul", (x, other), torch.mul),
        _case("add_bcast", "elementwise", "add", (x, vec), torch.add),
        _case("mul_bcast", "elementwise", "mul", (x, vec), torch.mul),
        _case("gelu", "elementwise", "gelu", (x,), F.gelu),
        _case("silu", "elementwise", "silu", (x,), F.silu),
        _case("layer_norm", "norm", "layer_norm", (x, gamma, beta),
              lambda t, g, b: F.layer_norm(t, (H,), g, b)),
        _case("rms_norm", "norm", "rms_norm", (x, Operand((H,))), attrs={"eps": EPS},
              direct=(aten._fused_rms_norm.default, rms_args)),
        _case("softmax", "softmax", "softmax", (x,), lambda t: torch.softmax(t, -1),
              attrs={"dim": -1}),
        reshape("reshape_split", x, (B, S, N, D)),
        reshape("reshape_merge", x4, (B, S, H)),
        reshape("reshape_merge_lead", x, (B * S, H)),
        _case("transpose", "transpose", "transpose", (x,), lambda t: t.transpose(1, 2),
              attrs={"dim0": 1, "dim1": 2}),
        reduce("sum_1", torch.sum, 1),
        reduce("sum_2", torch.sum, 2),
        reduce("mean_1", torch.mean, 1),
        reduce("mean_2", torch.mean, 2),
        # on CPU: the masked partial of a vocab-sharded table calls aten.equal (no meta kernel)
        _case("embedding", "embedding", "embedding", (ids, table), F.embedding, meta=False),
        _case("sdpa", "attention", "scaled_dot_product_attention", (q, k, v),
              attrs={"causal": False}, out_perm=BSHD,
              direct=(aten._scaled_dot_product_flash_attention.default, _sdpa_args)),
    ]
    # fmt: on
