"""The einsum rule engine: most ops state their sharding rule as einsum-like notation.

`matmul` is `bmk,kn->bmn`; an elementwise add with broadcasting is `bsh,h->bsh`; a sum over
dim 1 is `abc->ac`. Each letter names an index; a mesh axis may shard at most one letter per
op. `_` marks a dim that is never sharded (a broadcast or kept size-1 dim).

Policy: every mesh axis gets a list of options, and the mesh axes are chosen together (every
combination of options is priced, so a choice on one axis can shrink what another moves).
1. Options of a mesh axis: every letter some input arrives sharded on along the axis, every
   letter an input's hint shards (below), every letter an output is annotated to be sharded
   on, `P(op)` when the op passes `op` through (linear ops: sum and avg; max: max) and an
   input arrives partial (or an output is annotated partial), and `R`. An input sharded on
   the axis may move onto another dim (an all_to_all is often cheaper than a gather), and a
   partial input the op cannot pass through may be reduce-scattered onto a dim (half the
   bytes of an all-reduce), so on such an axis every letter of every input is an option
   too. An axis no input arrives sharded or partial on keeps to `R` and the annotated
   options: the rule does not split work that nothing asked it to split (DTensor does, for
   free local slices, and hands its consumers a layout they did not ask for). Letters that
   must stay whole, or whose size the axis does not divide, are dropped; a combination is
   valid when each letter divides over all the axes that shard it. `P(op)` keeps all linear
   inputs of an affine op partial, one input of a multilinear op (different axes may keep
   different inputs: rank (i, j) computing a_i b_j sums to a b).
2. A combination fixes every input's and output's placements. Its cost: the reshards of the
   inputs from their arriving specs, priced as the reshard planner would plan them
   (`spmd.cost.reshard_cost`: bytes per rank and a latency per collective, all axes
   together; free where an earlier consumer already made that copy,
   `RuleContext.input_versions`), plus converting each output to its target (its annotation;
   for an in-place update, the spec of the state it overwrites; for a partial output without
   annotation, replicated - the all-reduce that will resolve it - unless every consumer is a
   sum, `RuleContext.deferrable`: a sum of gradient contributions is reduced once, where its
   own rule counts it), plus compute: the op's FLOPs per rank (divided by the shards of the
   letters split), converted to bytes at `FLOPS_PER_BYTE`.
3. Input hints (`RuleContext.input_hints`: a pinned source's annotation, or the layout in
   which the forward op read a tensor its backward reads again) are honoured: combinations
   that would use such an input in another placement (replicated and partial count as one:
   nothing moves between them) are set aside, unless every combination would.
4. The cheapest remaining combination wins; ties go to fewer bytes moved now (a reduction
   left for later may be absorbed by a later op), then to no new partial output (passing
   an arriving partial through does not count), then to fewer letters split by several
   axes, fewer replicated axes, fewer partial outputs, then to proposal order. The choice
   is deterministic.

A sharded letter that no output carries is contracted: the outputs become `Partial(op)`,
with `op` from the signature (`sum` for matmul, `avg` for a mean, `max` for a max).

Uneven shards: a letter may be split into blocks of different sizes (a dim that does not
divide its axes, cut as DTensor cuts it: `torch.chunk`'s ceil-sized blocks, the tail ones
short or empty) when every dim it names has the same size (the same cut everywhere) and
that size is at least the number of blocks; a letter naming dims of different sizes
(grouped-query heads) must divide evenly. A rank may still hold an empty block (6 over 4:
2, 2, 2, 0) and computes on it like any other, except where the op reduces the letter by
max or min (an empty block has no maximum): such a split is not an option. A mean over
uneven blocks is not the mean of the block means: where an `avg` letter is split unevenly,
every axis splitting an `avg` letter makes `Partial(sum)` and the kernel scales the local
mean by the rank's share of the elements (`global_mean`; an empty block's share is 0).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from shardlab.ir import TensorType
from shardlab.ops import get_op
from shardlab.placement import (
    DistSpec,
    Partial,
    Placement,
    Replicate,
    Shard,
    nested_split_sizes,
)
from shardlab.spmd.cost import FLOPS_PER_BYTE, local_bytes, reshard_cost
from shardlab.spmd.result import AxisChoice, RuleContext, RuleResult

UNSHARDABLE = "_"


@dataclass(frozen=True, slots=True)
class Signature:
    """An op's rule in einsum form, with the constraints that notation cannot say."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    #: Letters that must not be sharded (softmax dim, normalised dim, head dim, ...).
    whole: frozenset[str] = frozenset()
    #: Partial op of the outputs when a contracted letter is sharded (default "sum").
    contraction: Mapping[str, str] = field(default_factory=dict)
    #: "none", "multilinear" (partial in one input, the others replicated: matmul, mul),
    #: or "affine" (partial in all linear inputs together: add, concat).
    linearity: str = "none"
    #: Inputs the op is linear in (None: all of them).
    linear_inputs: frozenset[int] | None = None
    #: Partial ops that may pass through the op unchanged.
    passthrough: frozenset[str] = frozenset({"sum", "avg"})
    #: Local kernel the op needs when a letter is sharded (e.g. vocab-parallel embedding).
    kernels: Mapping[str, str] = field(default_factory=dict)
    #: Outputs that do not depend on the values of the linear inputs (dropout's mask): a
    #: candidate that passes a partial input through leaves them replicated, not partial.
    value_free_outputs: frozenset[int] = frozenset()
    #: Whether a partial input proposes its letters (a reduce-scatter onto one of them).
    #: Optimizers say no: the update runs in the layout of the parameter and its states,
    #: which the strategy decides (zero1 shards them); a partial gradient is reduced into it.
    scatter_partials: bool = True

    @property
    def notation(self) -> str:
        return f"{','.join(self.inputs)}->{','.join(self.outputs)}"

    def is_linear_in(self, index: int) -> bool:
        return self.linear_inputs is None or index in self.linear_inputs


@dataclass(frozen=True, slots=True)
class _Option:
    """One mesh axis' choice: the placement of every input and output on that axis."""

    label: str  # a letter, "R" or "P(op)"
    inputs: tuple[Placement, ...]
    outputs: tuple[Placement, ...]
    driver: int | None  # the input whose placement proposed it, if any
    honours: bool = True  # keeps every input hint on its axis (`honours_hints`)

    @property
    def shards(self) -> bool:
        """A letter divides the op's work among the axis' ranks; R and P do not."""
        return self.label != "R" and not self.label.startswith("P(")

    @property
    def new_partial(self) -> bool:
        """True when it makes outputs partial that no arriving input was partial in."""
        passthrough = self.label.startswith("P(") and self.driver is not None
        return not passthrough and any(isinstance(p, Partial) for p in self.outputs)

    @property
    def partial_out(self) -> bool:
        return any(isinstance(p, Partial) for p in self.outputs)


Combo = tuple[_Option, ...]


@dataclass(frozen=True, slots=True)
class _Scored:
    """A choice for every mesh axis, its estimated cost, and the part its inputs move now."""

    combo: Combo
    cost: float
    moved_now: float


def solve(ctx: RuleContext, sig: Signature) -> RuleResult:
    """Choose the placements of every mesh axis together and return the op's RuleResult."""
    assert len(sig.inputs) == len(ctx.input_types), (ctx.kind, sig.notation)
    assert len(sig.outputs) == len(ctx.output_types), (ctx.kind, sig.notation)
    mesh = ctx.mesh
    per_axis = [_options(ctx, sig, k) for k in range(mesh.ndim)]
    flops = get_op(ctx.kind).flops(ctx.input_types, ctx.output_types, ctx.attrs)
    scored = [
        _Scored(combo, *_cost(ctx, combo, flops))
        for combo in itertools.product(*per_axis)
        if _valid(ctx, sig, combo)
    ]
    assert scored, f"{ctx.kind}: no valid placement (replicated is always one)"
    pool = [s for s in scored if all(o.honours for o in s.combo)] or scored
    chosen = min(pool, key=lambda s: _rank(s, per_axis))
    best, cost = chosen.combo, chosen.cost
    choices = []
    for k, option in enumerate(best):
        others: dict[str, float] = {}
        for other in scored:
            label = other.combo[k].label
            if label != option.label and other.cost < others.get(label, math.inf):
                others[label] = other.cost
        axis = mesh.axis_names[k]
        choices.append(AxisChoice(axis, option.label, option.driver, cost, tuple(others.items())))
    letters = {o.label for o in best if o.shards}
    kernels = {sig.kernels[letter] for letter in letters if letter in sig.kernels}
    kernel = kernels.pop() if kernels else "default"
    outputs = [tuple(o.outputs[j] for o in best) for j in range(len(sig.outputs))]
    reason = _reason(ctx, sig, choices)
    if _uneven_mean(ctx, sig, best):
        kernel = GLOBAL_MEAN[kernel]
        outputs = [
            tuple(
                Partial("sum") if o.shards and sig.contraction.get(o.label) == "avg" else p
                for o, p in zip(best, placements, strict=True)
            )
            for placements in outputs
        ]
        reason += (
            "; the mean's blocks are uneven, so each rank scales its local mean by its share "
            "of the elements and the outputs are partial sums"
        )
    return RuleResult(
        input_specs=tuple(
            DistSpec(mesh, tuple(o.inputs[i] for o in best)) for i in range(len(sig.inputs))
        ),
        output_specs=tuple(DistSpec(mesh, placements) for placements in outputs),
        reason=reason,
        kernel=kernel,
        choices=tuple(choices),
        cost=cost,
    )


#: kernel -> the kernel that also rescales a mean over uneven blocks (`runtime.kernels`)
GLOBAL_MEAN = {
    "default": "global_mean",
    "cross_entropy_vocab_parallel": "cross_entropy_vocab_parallel+global_mean",
}


def _parts(ctx: RuleContext, combo: Combo) -> dict[str, int]:
    """Letter -> the number of blocks the combination splits it into."""
    parts: dict[str, int] = {}
    for k, option in enumerate(combo):
        if option.shards:
            parts[option.label] = parts.get(option.label, 1) * ctx.mesh.shape[k]
    return parts


def _letter_sizes(ctx: RuleContext, sig: Signature, letter: str) -> set[int]:
    tensors = [
        *zip(sig.inputs, ctx.input_types, strict=True),
        *zip(sig.outputs, ctx.output_types, strict=True),
    ]
    return {t.shape[d] for letters, t in tensors for d, ch in enumerate(letters) if ch == letter}


def _uneven_mean(ctx: RuleContext, sig: Signature, combo: Combo) -> bool:
    """True when the combination splits a letter the op averages over into uneven blocks."""
    return any(
        sig.contraction.get(letter) == "avg"
        and any(size % count for size in _letter_sizes(ctx, sig, letter))
        for letter, count in _parts(ctx, combo).items()
    )


def _rank(
    scored: _Scored, per_axis: list[list[_Option]]
) -> tuple[float, float, int, int, int, int, tuple[int, ...]]:
    """Cheapest first; on a tie: fewer bytes moved now (a reduction left for later may be
    absorbed by a later op), fewer new partial outputs (passing an arriving partial
    through does not count: its all-reduce is only deferred), fewer letters split by
    several axes, fewer replicated axes, fewer partial outputs, then proposal order."""
    combo = scored.combo
    letters = [o.label for o in combo if o.shards]
    return (
        round(scored.cost, 6),
        round(scored.moved_now, 6),
        sum(o.new_partial for o in combo),
        len(letters) - len(set(letters)),
        sum(o.label == "R" for o in combo),
        sum(o.partial_out for o in combo),
        tuple(options.index(o) for options, o in zip(per_axis, combo, strict=True)),
    )


def honours_hints(ctx: RuleContext, k: int, inputs: Sequence[Placement]) -> bool:
    """True when using the inputs in `inputs` on mesh axis k keeps every input hint: the
    hinted placement itself, or replicated for partial and back (one rank keeps the value,
    the others add zeros: nothing moves; a linear op's bias joins partial sums that way).
    A local slice does not keep a hint: a backward op that sliced a tensor its forward op
    read whole would no longer mirror it."""
    for i, need in enumerate(inputs):
        want = ctx.input_hint_at(i, k)
        if want is None or need == want:
            continue
        if isinstance(want, Replicate | Partial) and isinstance(need, Replicate | Partial):
            continue
        return False
    return True


def _valid(ctx: RuleContext, sig: Signature, combo: Combo) -> bool:
    """Every letter splits over all the axes sharding it (`_divides`), at most one local
    kernel, and a mean over uneven blocks only where a kernel can rescale it."""
    parts = _parts(ctx, combo)
    kernels = {sig.kernels[letter] for letter in parts if letter in sig.kernels}
    if len(kernels) > 1 or not all(
        _divides(ctx, sig, letter, count) for letter, count in parts.items() if count > 1
    ):
        return False
    kernel = next(iter(kernels), "default")
    if _empty_extreme(ctx, sig, combo):
        return False
    return kernel in GLOBAL_MEAN or not _uneven_mean(ctx, sig, combo)


def _empty_extreme(ctx: RuleContext, sig: Signature, combo: Combo) -> bool:
    """True when the combination splits a letter the op reduces by max or min so that some
    rank's block is empty (it would have no maximum to contribute)."""
    for letter in {o.label for o in combo if o.shards}:
        if sig.contraction.get(letter) not in ("max", "min"):
            continue
        counts = [ctx.mesh.shape[k] for k, o in enumerate(combo) if o.label == letter]
        if any(
            size and 0 in nested_split_sizes(size, counts)
            for size in _letter_sizes(ctx, sig, letter)
        ):
            return True
    return False


def _cost(ctx: RuleContext, combo: Combo, flops: float) -> tuple[float, float]:
    """Estimated cost (module docstring, step 2): the exact reshards of the inputs, the
    outputs' conversion to their targets (`_output_target`), and the op's FLOPs per rank
    at `FLOPS_PER_BYTE`; and the inputs' part alone."""
    mesh = ctx.mesh
    inputs = 0.0
    for i, (t, spec) in enumerate(zip(ctx.input_types, ctx.input_specs, strict=True)):
        need = tuple(o.inputs[i] for o in combo)
        if spec is not None and not ctx.available(i, need):
            inputs += reshard_cost(t, mesh, spec.placements, need)
    outputs = 0.0
    for j, t in enumerate(ctx.output_types):
        produced = tuple(o.outputs[j] for o in combo)
        outputs += reshard_cost(t, mesh, produced, _output_target(ctx, combo, j, produced))
    shards = math.prod(mesh.shape[k] for k, o in enumerate(combo) if o.shards)
    return inputs + outputs + flops / shards / FLOPS_PER_BYTE, inputs


def _output_target(
    ctx: RuleContext, combo: Combo, j: int, produced: tuple[Placement, ...]
) -> tuple[Placement, ...]:
    """The placements output j must end up in: its hint where given; for an in-place update,
    the spec of the state it overwrites (the state keeps its spec: where it arrives, else
    where the op uses it); a partial output that nothing defers, replicated (its all-reduce
    will come); else as produced."""
    source = ctx.inplace[j] if j < len(ctx.inplace) else None
    if source is not None:
        spec = ctx.input_specs[source]
        base = spec.placements if spec is not None else tuple(o.inputs[source] for o in combo)
    else:
        base = tuple(
            Replicate() if isinstance(p, Partial) and not ctx.defers(j) else p for p in produced
        )
    out = []
    for k, p in enumerate(base):
        hint = ctx.hint_at(j, k)
        deferred = isinstance(p, Partial) and isinstance(hint, Replicate) and ctx.defers(j)
        out.append(p if hint is None or deferred else hint)  # a deferred sum stays partial
    return tuple(out)


def _divides(ctx: RuleContext, sig: Signature, letter: str, need: int) -> bool:
    """True when every dim named `letter` splits into `need` blocks the same way: evenly, or
    (uneven blocks, DTensor's layout) when all those dims have one size, at least `need`: a
    letter smaller than its rank count is not split by a rule (it would idle ranks the
    compute cost counts as working), though an annotation may lay a value out so."""
    sizes = _letter_sizes(ctx, sig, letter)
    if all(size % need == 0 for size in sizes):
        return True
    return len(sizes) == 1 and min(sizes) >= need


def _keepable(ctx: RuleContext, sig: Signature, letter: str, n: int) -> bool:
    """True when the op can compute with `letter` sharded over the n ranks of an axis."""
    return letter != UNSHARDABLE and letter not in sig.whole and _divides(ctx, sig, letter, n)


def _options(ctx: RuleContext, sig: Signature, k: int) -> list[_Option]:
    """The options of mesh axis k (module docstring, step 1), in proposal order."""
    n = ctx.mesh.shape[k]
    proposals: list[tuple[str, int | None]] = []
    moving: list[int] = []  # inputs sharded or partial on the axis: every letter is a target
    for i, spec in enumerate(ctx.input_specs):
        for p in (spec.placements[k] if spec is not None else None, ctx.input_hint_at(i, k)):
            if isinstance(p, Shard):
                proposals.append((sig.inputs[i][p.dim], i))
                moving.append(i)
            elif isinstance(p, Partial):
                if p.op in sig.passthrough and sig.linearity != "none" and sig.is_linear_in(i):
                    proposals.append((f"P({p.op})", i))
                elif sig.scatter_partials:
                    moving.append(i)  # resolved anyway: reduce-scatter onto a letter?
    for j in range(len(ctx.output_types)):
        p = ctx.hint_at(j, k)
        if isinstance(p, Shard):
            proposals.append((sig.outputs[j][p.dim], None))
        elif isinstance(p, Partial) and p.op in sig.passthrough and sig.linearity != "none":
            proposals.append((f"P({p.op})", None))
    proposals.append(("R", None))
    # inputs sharded or partial on the axis may move onto any letter: theirs first, then
    # the other inputs' (free slices of replicated inputs); an axis that no input arrives
    # sharded or partial on stays out of this (it is not the op's to shard)
    proposals += [(letter, i) for i in moving for letter in sig.inputs[i]]
    if moving:
        proposals += [(letter, i) for i in range(len(sig.inputs)) for letter in sig.inputs[i]]
    in_bytes = [local_bytes(t, s) for t, s in zip(ctx.input_types, ctx.input_specs, strict=True)]
    seen: set[str] = set()
    out: list[_Option] = []
    for label, driver in proposals:
        if label in seen:
            continue
        seen.add(label)
        if label == "R":
            option = _replicated(ctx, driver)
        elif label.startswith("P("):
            option = _partial(ctx, sig, k, label[2:-1], driver, in_bytes)
        elif _keepable(ctx, sig, label, n):
            option = _letter(ctx, sig, label, driver)
        else:
            continue
        honours = honours_hints(ctx, k, option.inputs)
        out.append(replace(option, honours=honours))
    return out


def _replicated(ctx: RuleContext, driver: int | None) -> _Option:
    return _Option(
        "R",
        (Replicate(),) * len(ctx.input_types),
        (Replicate(),) * len(ctx.output_types),
        driver,
    )


def _letter(ctx: RuleContext, sig: Signature, letter: str, driver: int | None) -> _Option:
    partial = Partial(sig.contraction.get(letter, "sum"))
    ins = tuple(
        Shard(letters.index(letter)) if letter in letters else Replicate() for letters in sig.inputs
    )
    outs = tuple(
        Shard(letters.index(letter)) if letter in letters else partial for letters in sig.outputs
    )
    return _Option(letter, ins, outs, driver)


def _partial(
    ctx: RuleContext,
    sig: Signature,
    k: int,
    op: str,
    driver: int | None,
    in_bytes: list[float],
) -> _Option:
    """Outputs partial on axis k. An affine op keeps all its linear inputs partial; a
    multilinear op keeps one (the arriving partial one, else the largest): a product of
    a partial and replicated values is partial. Different axes may keep different inputs:
    rank (i, j) computing a_i b_j sums to a b over both axes."""
    linear = [i for i in range(len(ctx.input_types)) if sig.is_linear_in(i)]
    if sig.linearity == "affine":
        keepers = set(linear)
    else:
        arriving = [
            i
            for i in linear
            if (spec := ctx.input_specs[i]) is not None and spec.placements[k] == Partial(op)
        ]
        pool = arriving or linear
        keepers = {max(pool, key=lambda i: (in_bytes[i], -i))}
    ins = tuple(Partial(op) if i in keepers else Replicate() for i in range(len(ctx.input_types)))
    outs = tuple(
        Replicate() if j in sig.value_free_outputs else Partial(op)
        for j in range(len(ctx.output_types))
    )
    return _Option(f"P({op})", ins, outs, driver)


def _reason(ctx: RuleContext, sig: Signature, choices: list[AxisChoice]) -> str:
    parts = []
    for c in choices:
        k = ctx.mesh.axis_index(c.axis)
        if c.choice == "R":
            why = "no input is sharded on it" if not c.alternatives else "cheapest choice"
            parts.append(f"{c.axis}: replicated ({why})")
        elif c.choice.startswith("P("):
            parts.append(f"{c.axis}: stays {c.choice} (the op is linear in its partial input)")
        else:
            contracted = all(c.choice not in out for out in sig.outputs)
            src = f" following input {c.driver}" if c.driver is not None else ""
            arrived = _arrived_as(ctx, sig, c, k)
            if isinstance(arrived, Partial):
                src = (
                    f": input {c.driver} arrives {arrived}, and reduce-scattering it onto "
                    f"'{c.choice}' costs less than all-reducing it"
                )
            elif arrived is not None:
                keep = (
                    "which the op cannot keep"
                    if not _keepable(ctx, sig, arrived, ctx.mesh.shape[k])
                    else "which costs more to keep"
                )
                src = (
                    f": input {c.driver} arrives sharded on '{arrived}', {keep}, and moving "
                    "it there costs less than gathering it"
                )
            what = f"shards '{c.choice}'{src}"
            if contracted:
                op = sig.contraction.get(c.choice, "sum")
                what += f"; '{c.choice}' is contracted, so outputs are Partial({op})"
            parts.append(f"{c.axis}: {what}")
    return f"{ctx.kind} [{sig.notation}]: " + "; ".join(parts)


def _arrived_as(ctx: RuleContext, sig: Signature, c: AxisChoice, k: int) -> str | Partial | None:
    """How the driving input arrives on axis k when the choice moved it: the letter it is
    sharded on, or its Partial; None when the choice keeps it."""
    spec = ctx.input_specs[c.driver] if c.driver is not None else None
    if spec is None or c.driver is None:
        return None
    p = spec.placements[k]
    if isinstance(p, Shard) and sig.inputs[c.driver][p.dim] != c.choice:
        return sig.inputs[c.driver][p.dim]
    return p if isinstance(p, Partial) else None


def broadcast_letters(types: list[TensorType], out_rank: int, letters: str) -> list[str]:
    """Einsum letters for operands broadcast numpy-style against an output of `out_rank`.

    Dims are aligned from the right; an operand dim of size 1 that the output broadcasts
    gets `_` (never sharded).
    """
    assert out_rank <= len(letters)
    out_letters = letters[:out_rank]
    out_shape = [1] * out_rank
    for t in types:
        for d, size in enumerate(t.shape):
            pos = out_rank - t.rank + d
            out_shape[pos] = max(out_shape[pos], size)
    result = []
    for t in types:
        chars = []
        for d, size in enumerate(t.shape):
            pos = out_rank - t.rank + d
            chars.append(UNSHARDABLE if size == 1 and out_shape[pos] != 1 else out_letters[pos])
        result.append("".join(chars))
    return result
