"""Faults for the torch backend's ranks: a compute kernel that is 2% off on `linear`.

What it is for: the torch backend's ranks are forked processes that import the runtime
afresh, so a test's `monkeypatch` of `runtime.kernels.KERNELS` does not reach them. A test
names `install` in `SHARDLAB_TORCH_RANK_SETUP` (`runtime.torch_launch`), as
`<this file's path>:install`, and every spawned rank patches its own kernels; the same
broken kernel (`linear_two_percent_off`) patches the test's process for the simulated side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardlab.runtime import kernels

#: `SHARDLAB_TORCH_RANK_SETUP`'s value that installs the fault in every rank.
SETUP = f"{Path(__file__).resolve()}:install"
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
    """Break this process's default kernel (called in every spawned rank)."""
    kernels.KERNELS["default"] = linear_two_percent_off(kernels.KERNELS["default"])
