"""Sharding rules, one module per op family; importing this package attaches them."""

from shardlab.spmd.rules import elementwise, linalg  # noqa: F401
