"""Rule for `embedding(ids[..], table[V, H]) -> [.., H]`, einsum-like `ab,vh->abh`.

ids letters follow the ids; a table sharded on H gives an output sharded on H; a table
sharded on V (vocab parallel) contracts V: each rank looks up only the ids inside its rows
(kernel `embedding_vocab_parallel`) and the output is `Partial(sum)`. The op is linear in
the table (ids replicated on that axis), so a `Partial(sum)` table passes through. ids are
integers and never partial.
"""

from __future__ import annotations

from dataclasses import replace

from shardlab.ops import attach
from shardlab.spmd.einsum import Signature, solve
from shardlab.spmd.result import RuleContext, RuleResult

LETTERS = "abcdefg"
VOCAB_KERNEL = "embedding_vocab_parallel"


def embedding_signature(ctx: RuleContext) -> Signature:
    """`ids,vh->ids+h` with V contracted by a sum and the vocab-parallel kernel."""
    ids = LETTERS[: ctx.input_types[0].rank]
    return Signature(
        inputs=(ids, "vh"),
        outputs=(ids + "h",),
        contraction={"v": "sum"},
        linearity="multilinear",
        linear_inputs=frozenset({1}),
        kernels={"v": VOCAB_KERNEL},
    )


def embedding_rule(ctx: RuleContext) -> RuleResult:
    result = solve(ctx, embedding_signature(ctx))
    if result.kernel == VOCAB_KERNEL:
        vocab = [c.axis for c in result.choices if c.choice == "v"]
        note = (
            f"; vocab parallel over {', '.join(vocab)}: each rank looks up only the ids inside "
            "its rows of the table, the others contribute zeros"
        )
        return replace(result, reason=result.reason + note)
    return result


attach("embedding", spmd_rule=embedding_rule)
