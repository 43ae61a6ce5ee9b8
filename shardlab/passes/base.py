"""What every pass shares: its result type, its registration record and its error."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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
#: The settings of a pass's tunable options to try, given the program(s) it will run on (one,
#: or every stage of a pipeline): option name -> value, in the order the values grow.
TuneFn = Callable[[Sequence[DistProgram]], list[dict[str, Any]]]


@dataclass(frozen=True)
class Pass:
    """A registered pass: its function, whether it runs by default, and its options."""

    name: str
    fn: PassFn
    doc: str
    default_on: bool = True
    options: Mapping[str, Any] = field(default_factory=dict)  # name -> default value
    #: candidates of a tunable option, which the cost guard picks from when the user sets none
    #: of the options they name (`passes.guard`); None: nothing to tune
    tune: TuneFn | None = None
