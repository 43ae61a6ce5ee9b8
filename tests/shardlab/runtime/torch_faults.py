"""Faults for the torch backend's ranks: a compute kernel that is 2% off on `linear`.

What it is for: the torch backend's ranks are forked processes that import the runtime
afresh, so a test's `monkeypatch` of `runtime.kernels.KERNELS` does not reach them. A test
names `install` in `SHARDLAB_TORCH_RANK_SETUP` (`runtime.torch_launch`), as
`<this file's path>:install`, and every spawned rank patches its own kernels; the same
broken kernel (`linear_two_percent_off`) patches the test's process for the simulated side.
A rank runs `linear` as a torch op (`runtime.torch_ops`), so `install` breaks both its numpy
kernel and its torch implementation; `install_torch` (`SETUP_TORCH`) breaks only the torch
implementation, which only the torch backend runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardlab.runtime import kernels

#: `SHARDLAB_TORCH_RANK_SETUP`'s value that installs the fault in every rank.
SETUP = f"{Path(__file__).resolve()}:install"
#: `SHARDLAB_TORCH_RANK_SETUP`'s value that breaks only the ranks' torch `linear`.
SETUP_TORCH = f"{Path(__file__).resolve()}:install_torch"
#: The op kind whose outputs come out wrong.
BROKEN_KIND = "linear"


def linear_two_percent_off(right: Any) -> Any:
    """`right` (a kernel), but `linear` ops' outputs are 2% too large."""

    def kernel(kind: str, xs: Any, attrs: Any, ctx: Any) -> Any:
        out = right(kind, xs, attrs, ctx)
        if kind == BROKEN_KIND and isinstance(out, list):
            return [x * 1.02 for x in out]
        return out

    return kernel


def install() -> None:
    """Break this process's default kernel and torch `linear` (called in every spawned rank)."""
    kernels.KERNELS["default"] = linear_two_percent_off(kernels.KERNELS["default"])
    install_torch()


def install_torch() -> None:
    """Make this process's torch `linear` 2% too large (called in every spawned rank)."""
    from shardlab.runtime import torch_ops  # imports torch: only in the ranks

    right = torch_ops.TORCH_IMPLS[BROKEN_KIND]
    torch_ops.TORCH_IMPLS[BROKEN_KIND] = lambda xs, attrs: [y * 1.02 for y in right(xs, attrs)]
