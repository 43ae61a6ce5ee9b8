"""The einsum rule engine: most ops state their sharding rule as einsum-like notation.

`matmul` is `bmk,kn->bmn`; an elementwise add with broadcasting is `bsh,h->bsh`; a sum over
dim 1 is `abc->ac`. Each letter names an index; a mesh axis may shard at most one letter per
op. `_` marks a dim that is never sharded (a broadcast or kept size-1 dim).

Policy, per mesh axis in mesh order:
1. Candidates: every letter some input arrives sharded on along the axis, every letter an
   output is annotated to be sharded on, every letter an input's hint shards (below), `P(op)`
   when the op passes `op` through (linear ops: sum and avg; max: max) and an input arrives
   partial (or an output is annotated partial), and `R`. An input that arrives sharded on a
   letter the op cannot keep (a letter that must stay whole, or that the axis does not
   divide) must move anyway, so every letter of that input is a candidate too: an all_to_all
   onto another dim is often cheaper than gathering it. A multilinear op keeps the same
   single input partial on every axis. Letters that must stay whole, or whose size the axis
   does not divide, are dropped.
2. Each candidate fixes every input's and output's placement on the axis. Its cost is the
   estimated bytes moved to reshard the inputs (`shardlab.spmd.cost`), plus converting
   outputs to their annotation, plus - for a partial output without annotation - the
   all-reduce that will eventually resolve it (unless every consumer is a sum,
   `RuleContext.deferrable`: a sum of gradient contributions is reduced once, where its
   own rule counts it). Inputs count their arriving blocks; an
   output's block is estimated from the axes decided so far and, for the later axes, the
   letters the inputs arrive sharded on. Compute counts too: the op's FLOPs per rank,
   converted to bytes at `FLOPS_PER_BYTE`, divided by the axis size only when the
   candidate shards a letter (`R` and `P` repeat the work on every rank of the axis).
3. Input hints (`RuleContext.input_hints`: a pinned source's annotation, or the layout in
   which the forward op read a tensor its backward reads again) are honoured: candidates
   that would use such an input in another placement - other than by a free local slice of
   a replicated input - are set aside, unless every candidate would.
4. The cheapest remaining candidate wins; ties go to a candidate that creates no new partial
   output (passing an arriving partial through does not count: its all-reduce is only
   deferred, and a later op may absorb it), then to sharding or passing through over
   replication, then to a non-partial output, then to the first candidate in input order.
   The choice is deterministic.

A sharded letter that no output carries is contracted: the outputs become `Partial(op)`,
with `op` from the signature (`sum` for matmul, `avg` for a mean, `max` for a max).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from shardlab.ir import TensorType
from shardlab.ops import get_op
from shardlab.placement import DistSpec, Partial, Placement, Replicate, Shard
from shardlab.spmd.cost import FLOPS_PER_BYTE, LATENCY_BYTES, axis_cost, local_bytes
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

    @property
    def notation(self) -> str:
        return f"{','.join(self.inputs)}->{','.join(self.outputs)}"

    def is_linear_in(self, index: int) -> bool:
        return self.linear_inputs is None or index in self.linear_inputs


@dataclass
class _Candidate:
    label: str  # a letter, "R" or "P(op)"
    inputs: list[Placement]
    outputs: list[Placement]
    driver: int | None
    cost: float = 0.0


def solve(ctx: RuleContext, sig: Signature) -> RuleResult:
    """Choose placements for every mesh axis and return the op's RuleResult."""
    assert len(sig.inputs) == len(ctx.input_types), (ctx.kind, sig.notation)
    assert len(sig.outputs) == len(ctx.output_types), (ctx.kind, sig.notation)
    mesh = ctx.mesh
    in_bytes = [local_bytes(t, s) for t, s in zip(ctx.input_types, ctx.input_specs, strict=True)]
    in_pl: list[list[Placement]] = [[] for _ in ctx.input_types]
    out_pl: list[list[Placement]] = [[] for _ in ctx.output_types]
    parts: dict[str, int] = {}  # letter -> product of the axis sizes sharding it so far
    choices: list[AxisChoice] = []
    flops = get_op(ctx.kind).flops(ctx.input_types, ctx.output_types, ctx.attrs)
    for k, axis in enumerate(mesh.axis_names):
        n = mesh.shape[k]
        expected = _expected_parts(ctx, sig, k, parts)
        out_bytes = [
            t.nbytes / _shards(sig.outputs[j], expected) for j, t in enumerate(ctx.output_types)
        ]
        held = {i for i, pl in enumerate(in_pl) if any(isinstance(p, Partial) for p in pl)}
        cands = _candidates(ctx, sig, k, n, parts, in_bytes, held, set(expected))
        work = flops / _shards("".join(parts), parts) / FLOPS_PER_BYTE
        for cand in cands:
            cand.cost = _cost(ctx, k, n, cand, in_bytes, out_bytes)
            cand.cost += work / n if _splits_work(cand) else work
        pool = [c for c in cands if honours_hints(ctx, k, n, c.inputs, in_bytes)] or cands
        best = min(
            pool,
            key=lambda c: (
                round(c.cost, 6),
                _new_partial(c),
                c.label == "R",
                any(isinstance(p, Partial) for p in c.outputs),
                cands.index(c),
            ),
        )
        for i, p in enumerate(best.inputs):
            in_pl[i].append(p)
        for j, p in enumerate(best.outputs):
            out_pl[j].append(p)
        if best.label not in ("R",) and not best.label.startswith("P"):
            parts[best.label] = parts.get(best.label, 1) * n
        alternatives = tuple((c.label, c.cost) for c in cands if c is not best)
        choices.append(AxisChoice(axis, best.label, best.driver, best.cost, alternatives))
    kernels = {sig.kernels[letter] for letter in parts if letter in sig.kernels}
    assert len(kernels) <= 1, f"{ctx.kind}: several local kernels {kernels}"
    return RuleResult(
        input_specs=tuple(DistSpec(mesh, tuple(p)) for p in in_pl),
        output_specs=tuple(DistSpec(mesh, tuple(p)) for p in out_pl),
        reason=_reason(ctx, sig, choices),
        kernel=kernels.pop() if kernels else "default",
        choices=tuple(choices),
    )


def honours_hints(
    ctx: RuleContext, k: int, n: int, inputs: list[Placement], in_bytes: list[float]
) -> bool:
    """True when using the inputs in `inputs` on mesh axis k keeps every input hint: the
    hinted placement itself, or a free change of an input that arrives as hinted (a local
    slice of a replicated input)."""
    for i, need in enumerate(inputs):
        want = ctx.input_hint_at(i, k)
        if want is None or need == want:
            continue
        spec = ctx.input_specs[i]
        src = spec.placements[k] if spec is not None else None
        if src == want and axis_cost(in_bytes[i], n, src, need) == 0.0:
            continue
        return False
    return True


def _splits_work(cand: _Candidate) -> bool:
    """A letter candidate divides the op's work among the axis' ranks; R and P do not."""
    return cand.label != "R" and not cand.label.startswith("P(")


def _new_partial(cand: _Candidate) -> bool:
    """True when the candidate makes outputs partial that no arriving input was partial in."""
    passthrough = cand.label.startswith("P(") and cand.driver is not None
    return not passthrough and any(isinstance(p, Partial) for p in cand.outputs)


def _expected_parts(
    ctx: RuleContext, sig: Signature, k: int, parts: dict[str, int]
) -> dict[str, int]:
    """`parts`, plus the letter each later mesh axis shards in the first input arriving
    sharded on it: an output's block is estimated like the inputs' arriving blocks."""
    out = dict(parts)
    for a in range(k + 1, ctx.mesh.ndim):
        for letters, spec in zip(sig.inputs, ctx.input_specs, strict=True):
            p = spec.placements[a] if spec is not None else None
            if isinstance(p, Shard) and letters[p.dim] not in sig.whole:
                out[letters[p.dim]] = out.get(letters[p.dim], 1) * ctx.mesh.shape[a]
                break
    return out


def _shards(letters: str, parts: Mapping[str, int]) -> int:
    total = 1
    for letter in letters:
        total *= parts.get(letter, 1)
    return total


def _divides(ctx: RuleContext, sig: Signature, letter: str, n: int, parts: dict[str, int]) -> bool:
    need = parts.get(letter, 1) * n
    tensors = [
        *zip(sig.inputs, ctx.input_types, strict=True),
        *zip(sig.outputs, ctx.output_types, strict=True),
    ]
    return all(
        t.shape[d] % need == 0
        for letters, t in tensors
        for d, ch in enumerate(letters)
        if ch == letter
    )


def _candidates(
    ctx: RuleContext,
    sig: Signature,
    k: int,
    n: int,
    parts: dict[str, int],
    in_bytes: list[float],
    held: set[int],
    taken: set[str],
) -> list[_Candidate]:
    """The candidates of mesh axis k (module docstring, step 1); `taken` holds the letters
    other mesh axes shard, which an input that must move anyway avoids on a tie."""
    proposals: list[tuple[str, int | None]] = []
    stuck: list[int] = []  # inputs arriving sharded on a letter the op cannot keep
    for i, spec in enumerate(ctx.input_specs):
        for p in (spec.placements[k] if spec is not None else None, ctx.input_hint_at(i, k)):
            if isinstance(p, Shard):
                letter = sig.inputs[i][p.dim]
                proposals.append((letter, i))
                if not _keepable(ctx, sig, letter, n, parts):
                    stuck.append(i)
            elif (
                isinstance(p, Partial)
                and p.op in sig.passthrough
                and sig.linearity != "none"
                and sig.is_linear_in(i)
            ):
                proposals.append((f"P({p.op})", i))
    for j in range(len(ctx.output_types)):
        p = ctx.hint_at(j, k)
        if isinstance(p, Shard):
            proposals.append((sig.outputs[j][p.dim], None))
        elif isinstance(p, Partial) and p.op in sig.passthrough and sig.linearity != "none":
            proposals.append((f"P({p.op})", None))
    proposals.append(("R", None))
    for i in stuck:
        letters = sorted(sig.inputs[i], key=lambda letter: letter in taken)
        proposals += [(letter, i) for letter in letters]
    seen: set[str] = set()
    out: list[_Candidate] = []
    for label, driver in proposals:
        if label in seen:
            continue
        seen.add(label)
        if label == "R":
            out.append(_replicated(ctx, driver))
        elif label.startswith("P("):
            out.append(_partial(ctx, sig, k, label[2:-1], driver, in_bytes, held))
        elif _keepable(ctx, sig, label, n, parts):
            out.append(_letter(ctx, sig, label, driver))
    return out


def _keepable(ctx: RuleContext, sig: Signature, letter: str, n: int, parts: dict[str, int]) -> bool:
    """True when the op can compute with `letter` sharded over n more ranks."""
    return (
        letter != UNSHARDABLE and letter not in sig.whole and _divides(ctx, sig, letter, n, parts)
    )


def _replicated(ctx: RuleContext, driver: int | None) -> _Candidate:
    return _Candidate(
        "R",
        [Replicate()] * len(ctx.input_types),
        [Replicate()] * len(ctx.output_types),
        driver,
    )


def _letter(ctx: RuleContext, sig: Signature, letter: str, driver: int | None) -> _Candidate:
    partial = Partial(sig.contraction.get(letter, "sum"))
    ins: list[Placement] = [
        Shard(letters.index(letter)) if letter in letters else Replicate() for letters in sig.inputs
    ]
    outs: list[Placement] = [
        Shard(letters.index(letter)) if letter in letters else partial for letters in sig.outputs
    ]
    return _Candidate(letter, ins, outs, driver)


def _partial(
    ctx: RuleContext,
    sig: Signature,
    k: int,
    op: str,
    driver: int | None,
    in_bytes: list[float],
    held: set[int],
) -> _Candidate:
    """`held`: inputs already partial on an earlier mesh axis. A multilinear op keeps one
    partial input over all axes: a @ b with a partial on one axis and b on another would
    sum the cross terms of the two decompositions."""
    linear = [i for i in range(len(ctx.input_types)) if sig.is_linear_in(i)]
    if sig.linearity == "affine":
        keepers = set(linear)
    elif held:
        keepers = set(held)
    else:
        arriving = [
            i
            for i in linear
            if (spec := ctx.input_specs[i]) is not None and spec.placements[k] == Partial(op)
        ]
        pool = arriving or linear
        keepers = {max(pool, key=lambda i: (in_bytes[i], -i))}
    ins: list[Placement] = [
        Partial(op) if i in keepers else Replicate() for i in range(len(ctx.input_types))
    ]
    outs: list[Placement] = [
        Replicate() if j in sig.value_free_outputs else Partial(op)
        for j in range(len(ctx.output_types))
    ]
    return _Candidate(f"P({op})", ins, outs, driver)


def _cost(
    ctx: RuleContext,
    k: int,
    n: int,
    cand: _Candidate,
    in_bytes: list[float],
    out_bytes: list[float],
) -> float:
    total = 0.0
    for i, spec in enumerate(ctx.input_specs):
        src = spec.placements[k] if spec is not None else None
        total += axis_cost(in_bytes[i], n, src, cand.inputs[i])
    for j, produced in enumerate(cand.outputs):
        hint = ctx.hint_at(j, k)
        if hint is not None:
            total += axis_cost(out_bytes[j], n, produced, hint)
        elif isinstance(produced, Partial) and n > 1 and not ctx.defers(j):
            total += 2 * out_bytes[j] * (n - 1) / n + LATENCY_BYTES
    return total


def _reason(ctx: RuleContext, sig: Signature, choices: list[AxisChoice]) -> str:
    parts = []
    for c in choices:
        if c.choice == "R":
            why = "no input is sharded on it" if not c.alternatives else "cheapest choice"
            parts.append(f"{c.axis}: replicated ({why})")
        elif c.choice.startswith("P("):
            parts.append(f"{c.axis}: stays {c.choice} (the op is linear in its partial input)")
        else:
            contracted = all(c.choice not in out for out in sig.outputs)
            src = f" following input {c.driver}" if c.driver is not None else ""
            moved = _moved_from(ctx, sig, c, k=ctx.mesh.axis_index(c.axis))
            if moved is not None:
                src = (
                    f": input {c.driver} arrives sharded on '{moved}', which the op cannot "
                    "keep, and moving it there costs less than gathering it"
                )
            what = f"shards '{c.choice}'{src}"
            if contracted:
                op = sig.contraction.get(c.choice, "sum")
                what += f"; '{c.choice}' is contracted, so outputs are Partial({op})"
            parts.append(f"{c.axis}: {what}")
    return f"{ctx.kind} [{sig.notation}]: " + "; ".join(parts)


def _moved_from(ctx: RuleContext, sig: Signature, c: AxisChoice, k: int) -> str | None:
    """The letter the driving input arrives sharded on when the choice moved it elsewhere."""
    if c.driver is None or ctx.input_specs[c.driver] is None:
        return None
    spec = ctx.input_specs[c.driver]
    assert spec is not None
    p = spec.placements[k]
    if isinstance(p, Shard) and sig.inputs[c.driver][p.dim] != c.choice:
        return sig.inputs[c.driver][p.dim]
    return None


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
