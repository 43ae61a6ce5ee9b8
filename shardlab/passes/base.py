"""What every pass shares: its result type, its registration record and its error."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardlab.errors import ShardlabError
from shardlab.ir import Graph
from shardlab.program import DistProgram


class PassError(ShardlabError):
    """An unknown pass, or an option a pass does not take."""

    code = "invalid_pass"


@dataclass(frozen=True)
class PassResult:
    """What a pass returns: the new program and what changed."""

    program: DistProgram
    summary: dict[str, Any] = field(default_factory=dict)


PassFn = Callable[[DistProgram, Graph, Mapping[str, Any]], PassResult]


@dataclass(frozen=True)
class Pass:
    """A registered pass: its function, whether it runs by default, and its options."""

    name: str
    fn: PassFn
    doc: str
    default_on: bool = True
    options: Mapping[str, Any] = field(default_factory=dict)  # name -> default value
