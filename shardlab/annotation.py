"""Annotations: placements asked for values whose names match a glob, and their text forms.

An `Annotation` asks that values whose names match a glob take given placements on some
mesh axes. Text forms (`--annotate`):

- `w0=S(1)` or `layers.*.mlp.up_proj.weight=RS(1)`: one placement per mesh axis;
- `tokens=dp:S(0)` or `x=dp:S(0),tp:R`: placements on the named axes only.

An annotation on a source value (a parameter, optimizer state or input) *pins* it by default:
sharding rules never communicate to move it on those mesh axes, so a tensor-parallel weight
is never gathered. Templates whose recipe gathers parameters before use (FSDP, ZeRO-3) write
annotations with `pin=False`. This module is the lowest layer of strategies: templates and
`Strategy` build on it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from shardlab.errors import MeshError, PlacementError, ShardlabError
from shardlab.mesh import Mesh
from shardlab.placement import Placement, parse_placements


class StrategyError(ShardlabError):
    """A strategy is malformed: unknown template, bad annotation text, unknown option."""

    code = "invalid_strategy"


@dataclass(frozen=True, slots=True)
class Annotation:
    """Placements on some mesh axes for every value whose name matches `pattern`.

    `pin`: on a source value, rules must not communicate to move it on these mesh axes
    (module docstring); a template that gathers parameters before use writes `pin=False`.
    `note` says why a template wrote it, where a reviewer should know (e.g. a projection
    kept replicated because its heads do not divide the mesh axis).
    """

    pattern: str
    placements: tuple[tuple[str, Placement], ...]
    source: str = "user"
    pin: bool = True
    note: str = ""

    @classmethod
    def parse(cls, text: str, mesh: Mesh, source: str = "user") -> Annotation:
        """Parse `glob=S(0)R` (every axis) or `glob=dp:S(0),tp:R` (named axes)."""
        pattern, sep, value = text.rpartition("=")
        pattern, value = pattern.strip(), value.strip()
        if not sep or not pattern or not value:
            raise StrategyError(
                f"annotation {text!r} is not of the form 'glob=placements'", annotation=text
            )
        return cls(pattern, parse_axis_placements(value, mesh, text), source)

    def text(self) -> str:
        return f"{self.pattern}=" + ",".join(f"{a}:{p}" for a, p in self.placements)

    def to_json(self) -> dict[str, Any]:
        """`pattern`, `placements` by mesh axis, `source`, and `pin` when it is off."""
        out: dict[str, Any] = {
            "pattern": self.pattern,
            "placements": {a: str(p) for a, p in self.placements},
            "source": self.source,
        }
        if not self.pin:
            out["pin"] = False
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], mesh: Mesh) -> Annotation:
        pattern = data.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise StrategyError(f"annotation {dict(data)!r} lacks a 'pattern'")
        pin = data.get("pin", True)
        if not isinstance(pin, bool):
            raise StrategyError(f"annotation {pattern!r}: 'pin' must be true or false, got {pin!r}")
        raw = data.get("placements")
        if isinstance(raw, str):
            parsed = cls.parse(f"{pattern}={raw}", mesh, str(data.get("source", "user")))
            return cls(parsed.pattern, parsed.placements, parsed.source, pin)
        if not isinstance(raw, Mapping) or not raw:
            raise StrategyError(
                f"annotation {pattern!r}: 'placements' must be a text form or an object "
                "mapping mesh axes to placements"
            )
        text = ",".join(f"{a}:{p}" for a, p in raw.items())
        placements = parse_axis_placements(text, mesh, pattern)
        return cls(pattern, placements, str(data.get("source", "user")), pin)


def parse_axis_placements(
    value: str, mesh: Mesh, context: str
) -> tuple[tuple[str, Placement], ...]:
    """`S(0)R` (one per axis) or `dp:S(0),tp:R` -> ((axis, placement), ...) in mesh order."""
    if ":" not in value:
        try:
            placements = parse_placements(value, mesh)
        except PlacementError as exc:
            raise PlacementError(f"annotation {context!r}: {exc.message}", **exc.detail) from None
        return tuple(zip(mesh.axis_names, placements, strict=True))
    found: dict[str, Placement] = {}
    for part in value.split(","):
        axis, sep, text = part.partition(":")
        axis = axis.strip()
        if not sep:
            raise StrategyError(
                f"annotation {context!r}: {part!r} is not of the form axis:placement"
            )
        try:
            mesh.axis_index(axis)
        except MeshError as exc:
            raise MeshError(f"annotation {context!r}: {exc.message}", axis=axis) from None
        if axis in found:
            raise StrategyError(f"annotation {context!r} names mesh axis {axis!r} twice")
        (placement,) = parse_placements(text.strip(), 1)
        found[axis] = placement
    return tuple((a, found[a]) for a in mesh.axis_names if a in found)


@lru_cache(maxsize=4096)
def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile(fnmatch.translate(pattern))


def match_values(pattern: str, names: Collection[str]) -> list[str]:
    """The names a glob matches (`*` also crosses dots), in the order of `names`; exact names
    are looked up directly (pass a dict's keys or a set: templates write thousands of them)."""
    if not any(ch in pattern for ch in "*?["):
        return [pattern] if pattern in names else []
    regex = _glob(pattern)
    return [name for name in names if regex.match(name)]


@dataclass(frozen=True, slots=True)
class TemplateUse:
    """A template applied on one mesh axis, e.g. `megatron_tp` on `tp`."""

    name: str
    axis: str

    def __str__(self) -> str:
        return f"{self.name}:{self.axis}"
