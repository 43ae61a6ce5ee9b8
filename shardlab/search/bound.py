"""A lower bound on a pipelined candidate's step time, so the search can skip the candidates
that cannot beat the best plan it already has (branch and bound).

The bound comes from a flat candidate (no pipeline) with the same tensor parallelism, which
the search plans first. On `pp x dp x tp` with `m` micro-batches and `v` chunks per stage:

- Work. Each rank of the flat mesh `1 x (pp*dp) x tp` runs every layer's forward and
  backward on `batch / (pp*dp)` sequences. A pipeline's stages together run the same ops on
  `m` micro-batches of `batch / (dp*m)` sequences each, with `m >= pp`: the same FLOPs in
  smaller kernels. The roofline's efficiency does not grow as a kernel shrinks, and weights
  are read once per micro-batch, so the average stage works at least as long as a flat
  rank: `C = compute - optimizer + exposed tensor-parallel comm` of the flat plan (the
  optimizer step is left out: a stage updates fewer parameters than a flat replica).
- Bubble. However the stages differ, 1F1B takes at least `(m + pp - 1)` units of the average
  stage, and interleaving `v` chunks `(m + (pp - 1) / v)`: the step is at least
  `C * (1 + (pp - 1) / (v * m))`.
- The busiest stage. Layers do not split: each stage runs its layers on all `pp` shares of
  the flat rank's sequences, every chunk holds a layer, the first stage runs the embedding
  and the last the head and loss (`C_first`, `C_last`: the flat rank's work in the modules
  before and after the layers, `evaluate.edge_work`). So some stage works at least `pp`
  times the least largest share of whole layers (`C_layers / L` each) with those modules
  that any split can give (`busiest_stage`: on 64 stages of 80 layers, 1.6 times the
  layers' average; on 24 stages of a 48-layer GPT whose head weighs a layer, 1.5 times).
- The last stage. It starts once the first micro-batch's forward has crossed the stages
  before it, and the last micro-batch's backward crosses them again after it ends: at
  least one layer per chunk before it each way, and with one chunk per stage the whole
  work of one micro-batch on those stages, `(total - own) / m` (`last_stage`; the bubble
  of an uneven pipeline whose head outweighs its share of layers).
- A stage of 1F1B. Stage `k` runs `w = pp - k` forwards before its first backward, which
  waits for the first micro-batch's forward and backward through every stage after it;
  from then on it runs its `m` backwards and `m - w` forwards one at a time, and its last
  backward then crosses the stages before it. So the step is at least
  `T1 + (m - 1) b_k + (m - w) f_k`, `T1` one micro-batch's work on every stage and `f_k`,
  `b_k` stage `k`'s forward and backward of one micro-batch (`one_f_one_b`): a stage with
  a layer more than the others paces the whole pipeline, more the earlier it stands. The
  layers are dealt out whole as above, the least largest of these bounds over every split
  (each stage's depends only on its own layers), with the forward and backward compute of
  the flat rank's layers (`layer_compute`: no communication; recomputation adds to the
  backward only) and the embedding and head counted at the forwards' weight.
- All but the 1F1B stage's count the exposed tensor-parallel collectives with the compute:
  every micro-batch waits for its own, as a flat rank does.
- Under FSDP every forward unit gathers its layers' matrices over dp, one collective at a
  time on the data-parallel stream, so a layer's forward takes at least that gather
  (`floors.gather_floor`), however well the compute hides it.
- Recomputation only adds work: a leaner recipe's step is at least that of the same plan
  without it, which the search has planned first.

Pipelines of the same micro-batch run the same layers (`unit_work`): the tensor-parallel
degree, the sequences a micro-batch gives each data-parallel rank and sequence parallelism
fix a layer's forward and backward unit, whatever the stages, schedule and data-parallel
recipe (`SAME_UNITS`; FSDP's gathers on top). Once one is planned, with three chunks or more
(one between the embedding's and the head's), the bounds above stand on its units, per
layer, as well as on the flat plans' work (`units_bound`): a micro-batch of one sequence
runs its kernels far below a flat rank's efficiency, which the flat plans cannot show.

The first stage ends its units last: the last micro-batch's backward ends there. Its tail
then reduces its gradients over dp (`SAME_UNITS`: after the last backward), so each bound
above is followed by one reduce-scatter of the fewest float32 gradients it can hold: the
embedding's and one layer's per chunk (`floors.tail_floor`).

Memory is ordered, and bounded. A candidate is *leaner* than another with the same mesh and
data-parallel recipe when it has sequence parallelism where the other has, it recomputes
more, it cuts the batch into as many micro-batches or more (1F1B keeps the same number of
smaller ones in flight), and it runs one chunk per stage where the other interleaves
(interleaving keeps more micro-batch chunks in flight during its warm-up; not under FSDP,
whose parameters gathered for a chunk halve with interleaving): `leaner_or_equal`.
(The recipes are not ordered:
at small shapes ZeRO-1's gathered parameters or FSDP's gathered layer can outweigh what
they shard; the tests found both.) What a leaner candidate cannot fit by more than
`MEMORY_SLACK`, a heavier one cannot fit either (at tiny shapes a leaner plan can hold a
percent more: recomputed buffers, collectives' staging), so the search skips it and goes on
to its recomputation.

Memory has a bound too (`state_bound`): every rank holds its share of the parameters and
their optimizer state for the whole step, at least `P / (pp * tp)` elements
(more where a parameter is not split), at the bytes per element its data-parallel recipe
leaves it (`state_bytes`). A candidate whose share alone exceeds the memory is not planned,
and neither is any leaner recomputation of it (recomputation frees activations only).

Siblings share their stages' work. On a mesh with pipeline stages, the data-parallel recipes
`dp`, `zero1` and `zero2` run the same forward and backward units (the gradient reductions
and the optimizer step wait for the tail, after the last backward), so the stages end their
units at the same moment (`stages_end_s`), and only their tails differ; FSDP and HSDP run
the same units with their parameters gathered on top (more work, never less). So a
pipelined candidate's step is at least the `stages_end_s` of a `dp`, `zero1` or `zero2`
sibling planned before it (the same mesh, schedule, micro-batches, sequence parallelism and
recomputation): `sibling_work`, `sibling_bound`. Their tails differ, but each reduces the
same float32 gradients over the data-parallel ranks, as all-reduces (dp) or reduce-scatters
(ZeRO, FSDP), after the first stage's units and tied all-reduces: so the step is also at
least when the sibling's first stage starts its tail plus one reduce-scatter of its
gradient bytes (`first_tail_at_s + first_reduce_s`, `StageCost.reduce_floor_s`; 7 to 15%
of a 30B GPT's pipelined step). A screened sibling's counts less the screening margin.
Tested against every pipelined candidate of two small spaces
(`tests/shardlab/search/test_bound.py`).

Every term the bound leaves out (communication, the embedding and head's imbalance, the
optimizer) makes the true step longer. The search still keeps `SLACK` in hand, for a
calibrated compute table whose measured curves need not be monotone. The bound is tested
against every pipelined candidate of two small spaces (`tests/shardlab/search/test_bound.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass

from shardlab.ir import DTYPE_BYTES, Graph, ValueKind
from shardlab.search.evaluate import Evaluation
from shardlab.search.screen import STEP_MARGIN, WORK_MARGIN, least_memory, screened_at
from shardlab.search.space import GATHERING, RECOMPUTE, Candidate

#: A candidate is skipped when its bound exceeds the best step by more than this fraction.
SLACK = 0.02
#: A leaner candidate over the memory by more than this fraction rules out heavier ones.
MEMORY_SLACK = 0.05


@dataclass(frozen=True)
class FlatWork:
    """The least work per rank of the flat candidates of one tensor-parallel degree: all
    of it (`step`: compute without the optimizer's, and exposed tensor-parallel comm) and
    that of the repeated layers (`layers`)."""

    step: float
    layers: float
    #: the modules before the layers (the embedding) and after them (head and loss)
    first: float = 0.0
    last: float = 0.0
    #: the layers' forward and backward compute alone (`evaluate.layer_compute`)
    forward: float = 0.0
    backward: float = 0.0


def flat_work(evaluations: Iterable[Evaluation]) -> dict[int, FlatWork]:
    """Per tensor-parallel degree, the least work of the flat candidates planned so far;
    a screened one's less its margin (`screen.WORK_MARGIN`: sums over the layers, which
    screening draws exactly where the layers are alike)."""
    out: dict[int, FlatWork] = {}
    for e in evaluations:
        c = e.candidate
        if c.mesh.pp != 1 or e.error is not None or "compute_s" not in e.terms:
            continue
        t, scale = e.terms, 1.0 / (1.0 + WORK_MARGIN) if e.screened is not None else 1.0
        work = FlatWork(
            (t["compute_s"] - t.get("optimizer_s", 0.0) + t.get("exposed_tp_s", 0.0)) * scale,
            t.get("layers_s", 0.0) * scale,
            t.get("first_s", 0.0) * scale,
            t.get("last_s", 0.0) * scale,
            t.get("layers_forward_s", 0.0) * scale,
            t.get("layers_backward_s", 0.0) * scale,
        )
        least = out.get(c.mesh.tp, work)
        out[c.mesh.tp] = FlatWork(*(min(a, b) for a, b in zip(
            dataclasses.astuple(work), dataclasses.astuple(least), strict=True)))  # fmt: skip
    return out


def bubble_factor(candidate: Candidate) -> float:
    """`1 + (pp - 1) / (v * m)`: how much longer than its work a pipeline's step must be
    where its stages are even."""
    c = candidate
    if c.mesh.pp == 1:
        return 1.0
    return 1.0 + (c.mesh.pp - 1) / ((c.virtual_stages or 1) * (c.microbatches or 1))


def step_bound(candidate: Candidate, work: dict[int, FlatWork], layers: int) -> float | None:
    """The least step time `candidate` of a model of `layers` layers can have (module
    docstring), or None without a flat reference."""
    c = candidate
    if c.mesh.pp == 1 or c.mesh.tp not in work:
        return None
    w = work[c.mesh.tp]
    return max(w.step * bubble_factor(c), busiest_stage(c, w, layers), last_stage(c, w, layers),
               one_f_one_b(c, w, layers))  # fmt: skip


def busiest_stage(candidate: Candidate, w: FlatWork, layers: int) -> float:
    """The least work of the busiest stage (module docstring): the layers dealt out whole,
    at least one per chunk, the embedding's work on the first stage and the head's on the
    last, each stage running `pp` flat ranks' shares of the sequences."""
    c = candidate
    pp, v = c.mesh.pp, c.virtual_stages or 1
    extra = (w.first, *[0.0] * (pp - 2), w.last)
    return pp * _least_largest((w.layers / max(layers, 1),) * pp, extra, v, layers)


@functools.lru_cache(maxsize=4096)
def _least_largest(
    per_layer: tuple[float, ...], extra: tuple[float, ...], least: int, layers: int
) -> float:
    """The least, over the ways to deal `layers` whole layers out to the stages (at least
    `least` each), of the largest `n_k * per_layer[k] + extra[k]` over the stages `k`
    (`busiest_stage`, `one_f_one_b`; the walk asks again for every queued candidate at
    every step)."""
    if min(per_layer) <= 0 or layers < least * len(per_layer):
        return max(extra)

    def holds(limit: float) -> bool:  # can every stage stay within `limit`?
        most = [math.floor((limit - e) / p + 1e-9) for p, e in zip(per_layer, extra, strict=True)]
        return min(most) >= least and sum(most) >= layers

    options = sorted({n * p + e for p, e in zip(per_layer, extra, strict=True)
                      for n in range(least, layers + 1)})  # fmt: skip
    lo, hi = 0, len(options) - 1  # the last option holds: every stage may take all layers
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if holds(options[mid]) else (mid + 1, hi)
    return options[lo]


def last_stage(candidate: Candidate, w: FlatWork, layers: int) -> float:
    """The least step through the last stage (module docstring): its own work (at least one
    layer per chunk and the head's), after the first micro-batch's forward reaches it and
    before the last one's backward leaves the stages before it."""
    c = candidate
    pp, v, m = c.mesh.pp, c.virtual_stages or 1, c.microbatches or 1
    layer = w.layers / max(layers, 1)
    own = pp * (v * layer + w.last)
    if v == 1:  # the stages before hold every other layer: their work of one micro-batch
        total = pp * (w.layers + w.first + w.last)
        return own + (total - own) / m
    return own + pp * ((pp - 1) * layer + w.first) / m  # one layer per chunk before it


def one_f_one_b(candidate: Candidate, w: FlatWork, layers: int) -> float:
    """The least step of a 1F1B pipeline by its stages' warm-up (module docstring); 0 for
    other schedules."""
    c = candidate
    pp, m = c.mesh.pp, c.microbatches or 1
    if c.schedule != "1f1b" or (c.virtual_stages or 1) > 1 or pp < 2 or layers < pp:
        return 0.0
    share = pp / m  # a micro-batch holds pp/m flat ranks' shares of the sequences
    f, b = w.forward * share / layers, w.backward * share / layers
    waits = [m - min(pp - k, m) for k in range(pp)]  # forwards left after the first backward
    per_layer = tuple((m - 1) * b + n * f for n in waits)
    edges = [w.first * share, *[0.0] * (pp - 2), w.last * share]
    extra = tuple(n * e for n, e in zip(waits, edges, strict=True))
    return (w.layers + w.first + w.last) * share + _least_largest(per_layer, extra, 1, layers)


def cannot_win(bound: float | None, best: float | None) -> bool:
    """Whether a candidate of this bound can be skipped, the best step so far being `best`."""
    return bound is not None and best is not None and bound > best * (1.0 + SLACK)


def state_bytes(recipe: str | None, dp: int, wide: bool = False) -> float:
    """Bytes per parameter element a rank holds for the whole step under a data-parallel
    recipe: a 16-bit parameter 2 and its float32 master weights and Adam moments 12
    (float32 parameters: 4 and moments 8), as ZeRO-1 and ZeRO-2 (the optimizer state) or
    FSDP (and the parameters) shard them over dp. Gradients are left out: they need not all
    be alive at once where the optimizer steps each as soon as it is reduced."""
    param, state = (4.0, 8.0) if wide else (2.0, 12.0)
    if recipe in ("zero1", "zero2"):
        return param + state / dp
    if recipe in ("fsdp", "zero3", "hsdp"):  # hsdp: `dp` is the shards' axis, dps
        return (param + state) / dp
    return param + state


def wide_params(graph: Graph) -> bool:
    """Whether the model's parameters are wider than 16 bits (float32)."""
    params = graph.values_of_kind(ValueKind.PARAM)
    return bool(params) and DTYPE_BYTES[params[0].type.dtype] > 2


def state_bound(candidate: Candidate, params: int, wide: bool = False) -> float:
    """The least bytes per rank `candidate` holds for parameters, gradients and optimizer
    state (module docstring)."""
    c = candidate
    return params / (c.mesh.pp * c.mesh.tp) * state_bytes(c.dp_recipe, c.state_shards, wide)


def leanness(c: Candidate) -> tuple[int, ...]:
    """Each way a candidate can save memory, larger for leaner (module docstring)."""
    one_chunk = int((c.virtual_stages or 1) == 1)
    return (int(c.sequence_parallel), RECOMPUTE.index(c.recompute), c.microbatches or 0,
            one_chunk)  # fmt: skip


def leaner_or_equal(a: Candidate, b: Candidate) -> bool:
    """Whether `a` needs no more memory than `b` (within `MEMORY_SLACK`): the same mesh and
    data-parallel recipe, both accumulating gradients or neither (accumulation keeps a
    gradient buffer a step without it does not), and `a` at least as lean in every other
    way."""
    if _kin(a) != _kin(b):
        return False
    return all(x >= y for x, y in zip(leanness(a), leanness(b), strict=True))


def _kin(c: Candidate) -> tuple[object, ...]:
    """What two candidates must share for their memory to be ordered by leanness: under
    FSDP the schedule too (a stage's parameters are gathered chunk by chunk, and an
    interleaved stage's chunks are half as large: the tests found one plan leaner so)."""
    chunks = (c.schedule, c.virtual_stages) if c.dp_recipe in GATHERING else None
    return (c.mesh, c.dp_recipe, c.annotations, c.schedule is None, chunks)


def clearly_short(e: Evaluation) -> bool:
    """Whether a planned candidate is over the usable memory by more than `MEMORY_SLACK`."""
    return e.error is None and (e.peak_memory_bytes or 0) > e.usable_bytes * (1 + MEMORY_SLACK)


def heavier_reason(lean: Evaluation) -> str:
    """One line for a candidate skipped because a leaner one did not fit (by its full plan,
    or by its screened figures less their margin, `screen`)."""
    gib = float(1 << 30)
    need, how = float(lean.peak_memory_bytes or 0), ""
    if lean.screened is not None:
        need, how = least_memory(lean), " at least"
    text = (f"needs more memory than {lean.candidate.label()}, which needs{how} "
            f"{need / gib:.1f} GiB of {lean.usable_bytes / gib:.1f} GiB usable")  # fmt: skip
    return text + (f" ({screened_at(lean)})" if lean.screened is not None else "")


def too_big_reason(bound: float, usable: float) -> str:
    """One line for a candidate whose parameter state alone cannot fit."""
    gib = float(1 << 30)
    return (f"needs at least {bound / gib:.3g} GiB of {usable / gib:.3g} GiB usable for "
            "parameters and optimizer state alone")  # fmt: skip


def pipeline_basis(candidate: Candidate, work: dict[int, FlatWork], layers: int) -> str:
    """What a pipelined candidate's bound stands on, for the skipped list."""
    c = candidate
    w = work[c.mesh.tp]
    bubble, busiest = w.step * bubble_factor(c), busiest_stage(c, w, layers)
    last, warm = last_stage(c, w, layers), one_f_one_b(c, w, layers)
    if warm > max(bubble, busiest, last):
        return (
            "its busiest stage, waiting in 1F1B's warm-up for the first micro-batch's "
            "round trip through the stages after it, takes"
        )
    if busiest >= max(bubble, last):
        return "its busiest stage takes"
    if last > bubble:
        return "its last stage, with the head, between the first and last micro-batches takes"
    return f"its compute with the pipeline's {bubble_factor(c) - 1:.0%} bubble takes"


def _units_key(c: Candidate) -> tuple[object, ...] | None:
    """What fixes a pipelined candidate's layer units (`unit_work`): the tensor-parallel
    degree, the sequences of a micro-batch per data-parallel rank (the global batch over
    `dp x m`, one batch per search), sequence parallelism; None without stages or with
    per-op annotations."""
    if c.mesh.pp == 1 or c.annotations:
        return None
    return (c.mesh.tp, c.mesh.dp * (c.microbatches or 1), c.sequence_parallel)


@dataclass(frozen=True)
class LayerUnits:
    """The least forward and backward unit of one layer and one micro-batch known for a
    unit key (`unit_work`), per recomputation."""

    forward: float
    backward: float
    label: str


def unit_work(evaluations: Iterable[Evaluation]) -> dict[tuple[object, ...], dict[str, LayerUnits]]:
    """Per unit key and recomputation, the least layer units of the pipelined candidates
    planned so far with the units of `SAME_UNITS` (`evaluate.layer_units`; a screened one's
    less its margin). Candidates with the same key run the same layer units whatever their
    stages, schedule and data-parallel recipe (FSDP's gather on top)."""
    out: dict[tuple[object, ...], dict[str, LayerUnits]] = {}
    for e in evaluations:
        key = _units_key(e.candidate)
        f, b = e.terms.get("layer_forward_s"), e.terms.get("layer_backward_s")
        if key is None or e.error is not None or f is None or b is None:
            continue
        if e.candidate.dp_recipe not in (*SAME_UNITS, None):
            continue
        if e.screened is not None:
            f, b = f / (1.0 + WORK_MARGIN), b / (1.0 + WORK_MARGIN)
        known = out.setdefault(key, {})
        old = known.get(e.candidate.recompute, LayerUnits(f, b, e.candidate.label()))
        label = e.candidate.label() if f + b < old.forward + old.backward else old.label
        known[e.candidate.recompute] = LayerUnits(min(f, old.forward), min(b, old.backward),
                                                  label)  # fmt: skip
    return out


def units_bound(
    candidate: Candidate,
    units: dict[tuple[object, ...], dict[str, LayerUnits]],
    flat: dict[int, FlatWork],
    layers: int,
    gather: float = 0.0,
) -> tuple[float, str] | None:
    """The least step `candidate` can have with the layer units of a candidate of its unit
    key (`unit_work`) planned before it, recomputing no more than it, and what it stands on;
    None without one. The layers' work is theirs, a forward no shorter than `gather` a
    layer (`floors.gather_floor`); the embedding's and head's the flat plans' (`flat_work`) where
    known."""
    c = candidate
    key = _units_key(c)
    if key is None or key not in units:
        return None
    mine = RECOMPUTE.index(c.recompute)
    known = [u for r, u in units[key].items() if RECOMPUTE.index(r) <= mine]
    if not known:
        return None
    f, b = min(u.forward for u in known), min(u.backward for u in known)
    f = max(f, gather)
    source = min(known, key=lambda u: u.forward + u.backward).label
    flat_units = (c.microbatches or 1) / c.mesh.pp  # one micro-batch -> a flat rank's share
    edges = flat.get(c.mesh.tp, FlatWork(0.0, 0.0))
    lay = layers * (f + b) * flat_units
    work = FlatWork(lay + edges.first + edges.last, lay, edges.first, edges.last,
                    layers * f * flat_units, layers * b * flat_units)  # fmt: skip
    bound = step_bound(c, {c.mesh.tp: work}, layers)
    assert bound is not None
    return bound, f"its layers at the units of {source} take"


#: The recipes whose pipelined units are the same (their reductions wait for the tail).
SAME_UNITS = ("dp", "zero1", "zero2")


def _sibling_key(c: Candidate) -> tuple[object, ...] | None:
    """What pipelined siblings share (module docstring); None where the bound does not
    apply (no pipeline stages, no data-parallel recipe)."""
    if c.mesh.pp == 1 or c.dp_recipe is None:
        return None
    return (c.mesh, c.sequence_parallel, c.recompute, c.schedule, c.microbatches,
            c.virtual_stages, c.annotations)  # fmt: skip


@dataclass(frozen=True)
class SiblingWork:
    """The least `stages_end_s` known among a pipelined candidate's siblings with the units
    of `SAME_UNITS` (a bound for every sibling: FSDP's and HSDP's units, which gather the
    parameters, are no shorter), with the label it comes from."""

    same: tuple[float, str] | None = None


def sibling_work(evaluations: Iterable[Evaluation]) -> dict[tuple[object, ...], SiblingWork]:
    """Per sibling group, the least stages' work of its planned (or screened, less the
    margin) members (module docstring)."""
    out: dict[tuple[object, ...], SiblingWork] = {}
    for e in evaluations:
        key = _sibling_key(e.candidate)
        end = e.terms.get("stages_end_s")
        if key is None or e.error is not None or end is None:
            continue
        end = max(end, e.terms.get("first_tail_at_s", 0.0) + e.terms.get("first_reduce_s", 0.0))
        if e.screened is not None:
            end /= 1.0 + STEP_MARGIN
        if e.candidate.dp_recipe not in SAME_UNITS:
            continue
        known = out.get(key, SiblingWork())
        mine = (end, e.candidate.label())
        out[key] = SiblingWork(min(known.same or mine, mine))
    return out


def bounds_sibling(a: Candidate, b: Candidate) -> bool:
    """Whether `a`'s stages, once planned, bound `b`'s step (module docstring): siblings,
    `a` of `SAME_UNITS`."""
    key = _sibling_key(b)
    return (key is not None and a != b and _sibling_key(a) == key
            and a.dp_recipe in SAME_UNITS)  # fmt: skip


def sibling_bound(
    candidate: Candidate, work: dict[tuple[object, ...], SiblingWork]
) -> tuple[float, str] | None:
    """The least step `candidate` can have by its siblings' stages (module docstring), and
    the sibling it stands on; None without one."""
    key = _sibling_key(candidate)
    if key is None or key not in work:
        return None
    known = work[key]
    return known.same  # a gathering recipe's units are no shorter than dp's
