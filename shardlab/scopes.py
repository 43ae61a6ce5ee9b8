"""Module scopes (`layers.3.attn.q_proj`): the layer an op or a buffer belongs to.

A scope is the module path of the op that made a value (backward ops carry their forward
op's scope). Reports group by layer, lowering prefetches gathered parameters one layer
ahead, and recomputation replays a layer: all of them cut a scope the same way here.
"""

from __future__ import annotations

import re

_LAYER = re.compile(r"^(.*?\.\d+)(?:\.|$)")


def layer_scope(scope: str) -> str:
    """A scope cut after its first numbered part (`layers.0.mlp.up_proj` -> `layers.0`),
    else its first part (`lm_head.x` -> `lm_head`)."""
    m = _LAYER.match(scope)
    return m.group(1) if m else scope.split(".", 1)[0]
