"""Sharding rules, one module per op family; importing this package attaches them."""

from shardlab.spmd.rules import (  # noqa: F401
    attention,
    backward,
    elementwise,
    embedding,
    linalg,
    loss,
    norm,
    reduce,
    shape,
)
