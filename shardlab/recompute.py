"""Activation recomputation: store less in the forward, run part of it again in the backward.

`apply_recompute(training, policy)` rewrites a training graph (`shardlab.autodiff`):

- `none`: the graph as it is; the backward reads what the forward kept.
- `selective` (Korthikanti et al. 2022, section 5): the attention core of every layer -
  `scores` (q k^T), `probs` (softmax), `probs_dropout` and `context` (probs v) with eager
  attention, `sdpa` with a fused kernel - runs again right before the layer's backward, so
  the [b, a, s, s] tensors (the 5as/h term of the paper's activation formula) are not kept.
  A fused (flash) kernel never stores them, so there it only costs the kernel's forward
  again, as Megatron-LM's selective recomputation of its core attention does.
- `full`: every forward op of every layer runs again before the layer's backward; the
  backward keeps only each layer's input (2sbh bytes per layer in 16 bits).

The region is replayed whole, as Megatron-LM's checkpointed function is, even where the
backward reads only some of its outputs. Replayed ops are backward ops (they run in the
backward, with the forward op's scope) named `<op>.recompute`, writing `<value>.recomputed`;
the layer's backward ops read those instead of the kept values. Dropout masks come from a
counter-based generator, so the replay reproduces them exactly. Only numbered layers
(`layers.3...`) are replayed: the embedding, final norm and head are kept as they are.
"""

from __future__ import annotations

import re

from shardlab.errors import GraphError
from shardlab.ir import Graph, Op, OpRole, Value, ValueKind
from shardlab.scopes import layer_scope

POLICIES = ("none", "selective", "full")
#: Local names of the ops of a layer's attention core (`layers.3.attn.probs`).
ATTENTION_CORE = frozenset({"scores", "probs", "probs_dropout", "context", "sdpa"})
#: Suffixes of replayed ops and of the values they write.
OP_SUFFIX = ".recompute"
VALUE_SUFFIX = ".recomputed"
_NUMBERED = re.compile(r".*\.\d+$")


class RecomputeError(GraphError):
    """An unknown recomputation policy."""

    code = "invalid_recompute"


def check_policy(policy: str) -> str:
    """`policy` if it is one of `POLICIES`, else a RecomputeError naming the choices."""
    if policy not in POLICIES:
        raise RecomputeError(
            f"recompute must be one of {', '.join(POLICIES)}, got {policy!r}", recompute=policy
        )
    return policy


def is_recompute(op: Op) -> bool:
    """True for an op that replays a forward op in the backward."""
    return op.name.endswith(OP_SUFFIX)


def kept_name(value: str) -> str:
    """The forward value a recomputed value replays (`x.recomputed` -> `x`)."""
    return value.removesuffix(VALUE_SUFFIX)


def _in_region(op: Op, policy: str) -> bool:
    layer = layer_scope(op.scope)
    if op.role != OpRole.FORWARD or not _NUMBERED.match(layer):
        return False
    if policy == "full":
        return True
    return op.scope.endswith(".attn") and op.name.rsplit(".", 1)[-1] in ATTENTION_CORE


def apply_recompute(training: Graph, policy: str) -> Graph:
    """`training` with each layer's `policy` region replayed before its backward."""
    check_policy(policy)
    if policy == "none":
        return training
    regions: dict[str, list[Op]] = {}
    for op in training.ops:
        if _in_region(op, policy):
            regions.setdefault(layer_scope(op.scope), []).append(op)
    if not regions:
        return training
    replayed = {v for ops in regions.values() for op in ops for v in op.outputs}
    values = dict(training.values)
    for v in replayed:
        new = f"{v}{VALUE_SUFFIX}"
        values[new] = Value(new, training.type_of(v), ValueKind.ACTIVATION)
    own = {layer: {v for f in region for v in f.outputs} for layer, region in regions.items()}
    ops: list[Op] = []
    started: set[str] = set()
    for op in training.ops:
        layer = layer_scope(op.scope)
        if op.role == OpRole.BACKWARD and layer in regions:
            if layer not in started:
                started.add(layer)
                # a layer replays from its own checkpoint (the kept input), never from another
                # layer's replay: chained replays would all run at the first backward
                ops += [_replay(f, own[layer]) for f in regions[layer]]
            op = _reading_replayed(op, own[layer])
        ops.append(op)
    return Graph(
        values.values(),
        ops,
        name=training.name,
        outputs=training.outputs,
        meta={**training.meta, "recompute": policy},
    )


def _replay(op: Op, replayed: set[str]) -> Op:
    """Forward op `op` run again in the backward, on the recomputed copies of its own
    layer's values `replayed` and on the kept values otherwise."""
    ins = tuple(f"{v}{VALUE_SUFFIX}" if v in replayed else v for v in op.inputs)
    outs = tuple(f"{v}{VALUE_SUFFIX}" for v in op.outputs)
    return Op(f"{op.name}{OP_SUFFIX}", op.kind, ins, outs, dict(op.attrs), op.scope,
              OpRole.BACKWARD)  # fmt: skip


def _reading_replayed(op: Op, layer_values: set[str]) -> Op:
    """Backward op `op` reading the recomputed copies of its layer's replayed values."""
    ins = tuple(f"{v}{VALUE_SUFFIX}" if v in layer_values else v for v in op.inputs)
    if ins == op.inputs:
        return op
    return Op(op.name, op.kind, ins, op.outputs, op.attrs, op.scope, op.role)
