"""Verify big plans safely: estimate what a verification holds, and scale a model down to a
twin that fits.

What it is for: `verify` runs the whole training step twice (one device, and every rank of
the mesh), so a full-size model (llama3-8b: 8 B parameters, float64) would need hundreds of
GB. Before a run, `verification_estimate` bounds the bytes it holds; beyond the limit a
verification either stops with a `ExecutionError` naming the estimate and the limit, or verifies
a **scaled-down twin** (`scaled_twin`): the same mesh, templates, options and structure (the
same family, attention, tying, head grouping and ffn ratio), with fewer layers, a smaller
head size, fewer heads, a smaller vocab, sequence and batch. The twin's shapes are chosen
greedily, one field at a time, each the smallest candidate under which the strategy still
places every value as it places the full model's layers (so the twin exercises the
same shardings, collectives and divisibilities). The report says which
ran (`summary["twin"]`: what changed, the full model's estimate and the limit).

The estimate is an upper bound: the reference run keeps every value of the training step
(parameters, gradients, two optimizer moments, each forward activation and its gradient),
and each of the mesh's ranks holds at most as much again.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shardlab.check import MAX_VERIFICATION_BYTES, gib
from shardlab.errors import ExecutionError, ShardlabError
from shardlab.ir import SOURCE_KINDS, Graph, ValueKind
from shardlab.models import TransformerConfig, build_model, get_preset
from shardlab.passes.pipeline_schedule import PipelineOptions
from shardlab.runtime.verify import VerifyReport, verify
from shardlab.strategy import Strategy

_DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 4}  # bf16: its float32 reference
#: The smallest head size a twin uses (rotary embeddings need an even size).
_MIN_HEAD_DIM = 8
_MIN_SEQ = 16


def has_twin(preset: str | None) -> bool:
    """Whether a model built from `preset` can be verified as a scaled-down twin."""
    try:
        return preset is not None and isinstance(get_preset(preset).config, TransformerConfig)
    except ShardlabError:
        return False


def verification_estimate(graph: Graph, ranks: int, dtype: str = "float64") -> int:
    """Upper bound of the bytes a verification of `graph` on `ranks` ranks holds in `dtype`:
    (ranks + 1) copies of the parameters with their gradients and two moments, and of every
    forward activation with its gradient."""
    params = graph.num_params()
    activations = sum(v.type.numel for v in graph.values.values() if v.kind == ValueKind.ACTIVATION)
    per_copy = 4 * params + 2 * activations
    return (ranks + 1) * per_copy * _DTYPE_BYTES.get(dtype, 8)


@dataclass(frozen=True, slots=True)
class Twin:
    """A scaled-down model that verifies the same strategy in less memory."""

    graph: Graph
    #: field -> [full model's value, twin's value], for every field that changed
    changes: dict[str, list[Any]]
    #: bytes the full model's verification would hold, and the twin's
    full_bytes: int
    twin_bytes: int
    limit_bytes: int

    def to_json(self) -> dict[str, Any]:
        """The report's `twin` entry."""
        return {
            "preset": self.graph.meta.get("preset"),
            "changes": self.changes,
            "full_estimate_bytes": self.full_bytes,
            "twin_estimate_bytes": self.twin_bytes,
            "limit_bytes": self.limit_bytes,
        }

    def describe(self) -> str:
        """One line: what was scaled down, and why."""
        what = ", ".join(f"{k} {a}->{b}" for k, (a, b) in self.changes.items())
        return (
            f"verified a scaled-down twin ({what}): the full model would hold about "
            f"{gib(self.full_bytes)}, over the limit of {gib(self.limit_bytes)}"
        )


def verify_safely(
    graph: Graph,
    strategy: Strategy,
    *,
    limit: int = MAX_VERIFICATION_BYTES,
    twin: bool = True,
    compute_dtype: str = "float64",
    **kwargs: Any,
) -> VerifyReport:
    """`runtime.verify.verify` of `graph` under `strategy` when its estimate is within
    `limit`; beyond it, of the scaled-down twin (`twin`, the default) or not at all (an
    ExecutionError naming the estimate and the limit). The report's summary gives the
    estimate (`estimate_bytes`, `limit_bytes`) and, for a twin, `twin` (`Twin.to_json`)."""
    need = verification_estimate(graph, strategy.mesh.size, compute_dtype)
    scaled: Twin | None = None
    if need > limit:
        if not twin:
            check_fits(graph, strategy, compute_dtype, limit)
        scaled = scaled_twin(graph, strategy, dtype=compute_dtype, limit=limit)
    run = scaled.graph if scaled is not None else graph
    report = verify(run, strategy, compute_dtype=compute_dtype, **kwargs)
    report.summary["estimate_bytes"] = scaled.twin_bytes if scaled is not None else need
    report.summary["limit_bytes"] = limit
    if scaled is not None:
        report.summary["twin"] = scaled.to_json()
    return report


def check_fits(graph: Graph, strategy: Strategy, dtype: str, limit: int) -> int:
    """The estimate of verifying `graph` under `strategy`; a ExecutionError naming the estimate
    and the limit when it is over."""
    need = verification_estimate(graph, strategy.mesh.size, dtype)
    if need > limit:
        raise ExecutionError(
            f"a verification of {graph.name!r} ({graph.num_params():,} parameters) on "
            f"{strategy.mesh.size} ranks would hold about {gib(need)} in {dtype}, over the "
            f"limit of {gib(limit)}; verify its scaled-down twin, or a smaller shape of the "
            "model under the same strategy",
            field="model",
            bytes=need,
            limit=limit,
        )
    return need


def scaled_twin(
    graph: Graph,
    strategy: Strategy,
    *,
    dtype: str = "float64",
    limit: int = MAX_VERIFICATION_BYTES,
    layout: Callable[[Graph, Strategy], Mapping[str, object]] | None = None,
) -> Twin:
    """The smallest twin of preset model `graph` that `strategy` places as it places the
    model, with its estimate under `limit`. `layout(graph, strategy)` gives every value's
    placement, raising for a shape the strategy cannot plan (default: the completed specs of
    `plan.build_plan` without passes). ExecutionError when `graph` is not a transformer
    preset, or when even the twin is over the limit."""
    preset, config = graph.meta.get("preset"), graph.meta.get("config")
    base = get_preset(preset).config if isinstance(preset, str) else None
    if not isinstance(base, TransformerConfig) or not isinstance(config, dict):
        raise ExecutionError(
            f"model {graph.name!r} is too large to verify and is not a transformer preset, so "
            "it has no scaled-down twin; verify a smaller graph under the same strategy",
            field="model",
        )
    full = dataclasses.replace(base, **config)
    twin = _shrink(str(preset), full, strategy, layout or _layout)
    twin_graph = build_model(str(preset), _overrides(base, twin))
    full_bytes = verification_estimate(graph, strategy.mesh.size, dtype)
    twin_bytes = verification_estimate(twin_graph, strategy.mesh.size, dtype)
    if twin_bytes > limit:
        raise ExecutionError(
            f"even the smallest twin of {graph.name!r} that {strategy} plans would hold about "
            f"{gib(twin_bytes)} in {dtype} on {strategy.mesh.size} ranks, over the limit of "
            f"{gib(limit)}",
            field="model",
            bytes=twin_bytes,
            limit=limit,
        )
    changes = {k: [getattr(full, k), getattr(twin, k)] for k in _SCALED
               if getattr(full, k) != getattr(twin, k)}  # fmt: skip
    return Twin(twin_graph, changes, full_bytes, twin_bytes, limit)


def _shrink(
    preset: str,
    full: TransformerConfig,
    strategy: Strategy,
    layout: Callable[[Graph, Strategy], Mapping[str, object]],
) -> TransformerConfig:
    """Greedy: fewer layers, then for each size the smallest candidate that the strategy
    places as it places the model with fewer layers (every value's placement the same)."""
    base = get_preset(preset).config
    assert isinstance(base, TransformerConfig)

    def placed(config: TransformerConfig) -> Mapping[str, object] | None:
        try:
            config.check()
            return layout(build_model(preset, _overrides(base, config)), strategy)
        except (ShardlabError, ValueError, ZeroDivisionError):
            return None

    current = dataclasses.replace(full, layers=min(full.layers, _min_layers(strategy)))
    want = placed(current)
    if want is None:
        raise ExecutionError(
            f"the strategy {strategy} does not plan {preset} with {current.layers} layers, so "
            "the model has no scaled-down twin",
            field="model",
        )

    def plans(config: TransformerConfig) -> bool:
        got = placed(config)
        return (
            got is not None and got.keys() == want.keys() and all(got[k] == want[k] for k in want)
        )

    for candidates in (_seq, _batch, _heads, _ffn, _vocab):
        for candidate in candidates(current):
            if candidate == current or plans(candidate):
                current = candidate
                break
    return current


def _min_layers(strategy: Strategy) -> int:
    """At least two layers, and one per pipeline chunk."""
    if "pp" not in strategy.mesh.axis_names:
        return 2
    pp = strategy.mesh.axis_size("pp")
    settings = PipelineOptions.from_options(strategy.options, pp)
    chunks = settings.virtual_stages or (2 if settings.schedule == "interleaved" else 1)
    return max(2, pp * chunks)


def _heads(c: TransformerConfig) -> Iterable[TransformerConfig]:
    """Fewer kv heads (the same grouping), then a smaller head size."""
    group = c.heads // c.kv_heads
    for kv in _divisors(c.kv_heads):
        for head_dim in _doublings(_MIN_HEAD_DIM, c.head_dim):
            hidden = kv * group * head_dim
            ffn = _ffn_for(c, hidden)
            yield dataclasses.replace(c, kv_heads=kv, heads=kv * group, hidden=hidden, ffn=ffn)


def _ffn_for(c: TransformerConfig, hidden: int) -> int:
    """The ffn size at the same ratio to hidden, a whole multiple of the head size."""
    ratio = c.ffn / c.hidden
    return max(1, round(ratio)) * hidden if ratio >= 1 else c.ffn


def _ffn(c: TransformerConfig) -> Iterable[TransformerConfig]:
    yield dataclasses.replace(c, ffn=_ffn_for(c, c.hidden))


def _vocab(c: TransformerConfig) -> Iterable[TransformerConfig]:
    for vocab in _doublings(64, c.vocab):
        yield dataclasses.replace(c, vocab=vocab)
    yield c


def _seq(c: TransformerConfig) -> Iterable[TransformerConfig]:
    for seq in _doublings(_MIN_SEQ, c.seq):
        yield dataclasses.replace(c, seq=seq)
    yield c


def _batch(c: TransformerConfig) -> Iterable[TransformerConfig]:
    for batch in _divisors(c.batch):
        yield dataclasses.replace(c, batch=batch)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _doublings(start: int, stop: int) -> list[int]:
    """start, 2*start, ... below `stop` (empty when start >= stop)."""
    return [start << k for k in range(max(0, math.ceil(math.log2(max(stop, 1) / start))))
            if start << k < stop]  # fmt: skip


#: Fields a twin scales (the others, and those derived from them, stay the model's).
_SCALED = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq", "batch")


def _overrides(base: TransformerConfig, config: TransformerConfig) -> dict[str, Any]:
    """The preset overrides that give `config`: the model's own settings and the twin's
    scaled fields."""
    return {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if getattr(config, f.name) != getattr(base, f.name) and f.name != "max_positions"
    }


def _layout(graph: Graph, strategy: Strategy) -> Mapping[str, object]:
    """The placement (as text) of every parameter, input and optimizer state in the plan of
    `graph` without passes: what the strategy decides. (Intermediate values may be placed
    otherwise at other sizes: the rules choose by cost.)"""
    from shardlab.plan import build_plan  # the plan imports the runtime's neighbours

    plan = build_plan(graph, strategy, passes=False)
    specs = plan.completed.specs
    return {
        v.name: str(specs[v.name])
        for v in plan.training.values.values()
        if v.kind in SOURCE_KINDS and v.name in specs
    }
