"""Check a sharding rule by executing it: the distributed result must equal one device's.

For given arriving specs, ask the rule what it needs, cut each global input into the blocks
of the *required* spec (partial values split at random), run the rule's local kernel on every
rank (`shardlab.runtime.sharded`), reassemble each output from its spec (partial values
reduced) and compare with the op's kernel on the global inputs.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardlab.ir import TensorType
from shardlab.mesh import Mesh
from shardlab.ops import get_op, infer_types
from shardlab.ops.base import Array
from shardlab.ops.reduce import reduce_dims
from shardlab.placement import (
    DistSpec,
    Partial,
    Placement,
    Replicate,
    Shard,
    check_placements,
    empty_blocks,
    local_shape_on,
)
from shardlab.runtime.distribute import assemble, distribute
from shardlab.runtime.sharded import run_sharded_op
from shardlab.spmd.engine import infer
from shardlab.spmd.result import RuleResult


@dataclass(frozen=True, slots=True)
class RuleCheck:
    """Outcome of one numeric check: the rule's answer and the worst error per output."""

    rule: RuleResult
    max_abs_error: tuple[float, ...]


def random_inputs(
    kind: str, types: Sequence[TensorType], attrs: Mapping[str, Any], rng: np.random.Generator
) -> list[Array]:
    """Global inputs for `kind`: normal floats, integers in range of the op's index bounds."""
    opdef = get_op(kind)
    bounds = opdef.index_bounds(types, attrs) if opdef.index_bounds else {}
    out: list[Array] = []
    for i, t in enumerate(types):
        if t.is_float:
            out.append(rng.standard_normal(t.shape))
        elif t.dtype == "bool":
            out.append(rng.integers(0, 2, t.shape).astype(bool))
        else:
            out.append(rng.integers(0, bounds.get(i, 2), t.shape))
    fix = CONSISTENT_INPUTS.get(kind)
    return fix(out, attrs) if fix else out


def _max_of_x(xs: list[Array], attrs: Mapping[str, Any]) -> list[Array]:
    """max_grad's y must be the max of x, or no position is a maximum."""
    dims = reduce_dims(xs[0].ndim, attrs, "max_grad")
    xs[1] = np.max(xs[0], axis=dims, keepdims=bool(attrs.get("keepdim", False)))
    return xs


def _nonnegative_second_moment(xs: list[Array], attrs: Mapping[str, Any]) -> list[Array]:
    """AdamW's exp_avg_sq is a running mean of squares: never negative."""
    xs[3] = np.abs(xs[3])
    return xs


#: Kinds whose random inputs must agree with each other to be meaningful.
CONSISTENT_INPUTS: dict[str, Callable[[list[Array], Mapping[str, Any]], list[Array]]] = {
    "max_grad": _max_of_x,
    "adamw": _nonnegative_second_moment,
}


def check_rule(
    kind: str,
    types: Sequence[TensorType],
    specs: Sequence[DistSpec | None],
    attrs: Mapping[str, Any],
    mesh: Mesh,
    rng: np.random.Generator,
    hints: Sequence[DistSpec | None] = (),
) -> RuleCheck:
    """Run `kind` distributed as its rule prescribes and measure the error per output."""
    globals_ = random_inputs(kind, types, attrs, rng)
    impl = get_op(kind).numpy_impl
    assert impl is not None
    expected = impl(globals_, dict(attrs))
    rule = infer(kind, types, specs, attrs, mesh, hints)
    out_types = infer_types(kind, types, dict(attrs))
    for t, spec in zip(types, rule.input_specs, strict=True):
        check_placements(t.shape, mesh, spec.placements, "required input")
    per_rank: dict[int, list[Array]] = {r: [] for r in mesh.ranks}
    for x, spec in zip(globals_, rule.input_specs, strict=True):
        for rank, block in distribute(np.asarray(x), spec, rng).items():
            per_rank[rank].append(block)
    outs = run_sharded_op(kind, attrs, rule, types, out_types, per_rank)
    errors = []
    for j, (t, spec) in enumerate(zip(out_types, rule.output_specs, strict=True)):
        blocks = {r: np.asarray(outs[r][j]) for r in mesh.ranks}
        for r, block in blocks.items():
            want_shape = local_shape_on(t.shape, mesh, spec.placements, r)
            assert block.shape == want_shape, (kind, r, block.shape, want_shape, str(spec))
        got = assemble(blocks, spec, t.shape)
        errors.append(_max_abs_diff(got, expected[j]))
    return RuleCheck(rule, tuple(errors))


def _max_abs_diff(got: Array, want: Array) -> float:
    """Largest absolute difference, in float64 (bool outputs such as masks count 0 or 1)."""
    diff = np.asarray(got, dtype=np.float64) - np.asarray(want, dtype=np.float64)
    return float(np.max(np.abs(diff), initial=0.0))


def placements_for(rank: int, partial: bool = True) -> list[Placement]:
    """Every placement one mesh axis can give a tensor of `rank` dims."""
    out: list[Placement] = [Replicate(), *(Shard(d) for d in range(rank))]
    return [*out, Partial("sum")] if partial else out


def all_specs(t: TensorType, mesh: Mesh, partial: bool = True) -> Iterator[DistSpec]:
    """Every DistSpec of `t` on `mesh` whose sharded dims are at least as long as their
    number of blocks: uneven blocks too, and the empty tail blocks DTensor's layout leaves
    (6 over 4: 2, 2, 2, 0); a dim shorter than its block count, which no rule splits
    (`einsum._divides`), is left out."""
    options = placements_for(t.rank, partial and t.is_float)
    for combo in itertools.product(options, repeat=mesh.ndim):
        check_placements(t.shape, mesh, combo)
        if all(t.shape[e.dim] >= len(e.sizes) for e in empty_blocks(t.shape, mesh, combo)):
            yield DistSpec(mesh, combo)


def _arriving_combos(
    types: Sequence[TensorType],
    mesh: Mesh,
    rng: np.random.Generator,
    sampled: int,
    free_max_ndim: int | None,
    pair: tuple[int, int] | None,
) -> list[tuple[DistSpec | None, ...]]:
    """The arriving spec combinations `sweep_rule` checks on one mesh."""
    options: list[list[DistSpec | None]] = [list(all_specs(t, mesh)) for t in types]
    if free_max_ndim is None or mesh.ndim <= free_max_ndim:
        options = [[None, *o] for o in options]
    if mesh.ndim >= 3:
        return [tuple(o[rng.integers(len(o))] for o in options) for _ in range(sampled)]
    if pair is None or mesh.ndim < 2:
        return list(itertools.product(*options))
    a, b = pair  # every (a, b) pair; the other inputs drawn at random
    combos = []
    for x, y in itertools.product(options[a], options[b]):
        pick = [o[rng.integers(len(o))] for o in options]
        pick[a], pick[b] = x, y
        combos.append(tuple(pick))
    return combos


def sweep_rule(
    kind: str,
    types: Sequence[TensorType],
    attrs: Mapping[str, Any],
    meshes: Sequence[Mesh],
    *,
    sampled: int = 300,
    seed: int = 0,
    with_hints: bool = True,
    tol: float = 1e-9,
    allow_fallback: bool = False,
    free_max_ndim: int | None = None,
    pair: tuple[int, int] | None = None,
) -> Counter[str]:
    """Check the rule of `kind` numerically (`check_rule`) for many arriving specs.

    On each mesh of fewer than 3 dims, every combination of `[None, *all_specs(t, mesh)]`
    over the inputs; on meshes of 3 dims or more, `sampled` combinations drawn at random.
    With `with_hints`, every fourth combination is checked once more with random output
    hints. `free_max_ndim` offers None (an unconstrained input) only on meshes of at most
    that many dims; `pair` enumerates, on 2-D meshes, only every combination of those two
    inputs and draws the others at random (for ops whose full product is too large). One
    generator seeded with `seed` serves all meshes, so a sweep is reproducible.

    Raises AssertionError naming the kind, arriving specs, hints, reason and error where the
    rule falls back (unless `allow_fallback`) or an output differs from one device's by
    `tol` or more. Returns how many checks used each kernel.
    """
    rng = np.random.default_rng(seed)
    out_types = infer_types(kind, list(types), dict(attrs))
    kernels: Counter[str] = Counter()
    for mesh in meshes:
        combos = _arriving_combos(types, mesh, rng, sampled, free_max_ndim, pair)
        hint_options = [list(all_specs(t, mesh)) for t in out_types]
        for n, specs in enumerate(combos):
            extra = with_hints and n % 4 == 0
            hints = [[o[rng.integers(len(o))] for o in hint_options]] if extra else []
            for hint in [[], *hints]:
                check = check_rule(kind, types, specs, attrs, mesh, rng, hint)
                worst = max(check.max_abs_error, default=0.0)
                failed = "fallback" if check.rule.fallback and not allow_fallback else ""
                if not failed and not worst < tol:
                    failed = f"error not below tol {tol:.3g}"
                if failed:
                    raise AssertionError(
                        f"{kind} on {mesh}: {failed}; arriving {[str(s) for s in specs]}, "
                        f"hints {[str(h) for h in hint]}, reason {check.rule.reason!r}, "
                        f"error {worst:.3g}"
                    )
                kernels[check.rule.kernel] += 1
    return kernels


def check_completed(completed: Any, seed: int = 0) -> dict[str, float]:
    """Execute every op of a completed graph distributed, as its RuleResult prescribes.

    Inputs are cut from the single-device reference values in the op's required specs
    (so reshards are taken as exact); each op's reassembled outputs are compared with the
    reference. Returns the max abs error per op. For small graphs: it runs the reference.
    """
    from shardlab.runtime.reference import run_reference

    graph = completed.graph
    env = run_reference(graph, seed=seed)
    rng = np.random.default_rng(seed)
    mesh = completed.strategy.mesh
    errors: dict[str, float] = {}
    for op in graph.ops:
        rule = completed.rules[op.name]
        in_types = [graph.type_of(v) for v in op.inputs]
        out_types = [graph.type_of(v) for v in op.outputs]
        per_rank: dict[int, list[Array]] = {r: [] for r in mesh.ranks}
        for v, spec in zip(op.inputs, rule.input_specs, strict=True):
            for rank, block in distribute(env[v], spec, rng).items():
                per_rank[rank].append(block)
        outs = run_sharded_op(op.kind, op.attrs, rule, in_types, out_types, per_rank)
        worst = 0.0
        for j, (v, spec) in enumerate(zip(op.outputs, rule.output_specs, strict=True)):
            got = assemble(
                {r: np.asarray(outs[r][j]) for r in mesh.ranks}, spec, out_types[j].shape
            )
            worst = max(worst, _max_abs_diff(got, env[v]))
        errors[op.name] = worst
    return errors
