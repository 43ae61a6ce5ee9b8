"""Sharding rules, one module per op family; importing this package attaches them."""

from shardlab.spmd.rules import (  # noqa: F401
    attention,
    backward,
    dropout,
    elementwise,
    embedding,
    linalg,
    loss,
    masked_softmax,
    norm,
    reduce,
    shape,
)
