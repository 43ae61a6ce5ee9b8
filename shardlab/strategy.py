"""A parallelization strategy: a mesh, templates on named mesh axes, annotations, options.

An `Annotation` asks that values whose names match a glob take given placements on some
mesh axes. Text forms (`--annotate`):

- `w0=S(1)` or `layers.*.mlp.up_proj.weight=RS(1)`: one placement per mesh axis;
- `tokens=dp:S(0)` or `x=dp:S(0),tp:R`: placements on the named axes only.

Templates (`shardlab.templates`) only write annotations; they apply in the order given, then
user annotations apply, and a later annotation overrides an earlier one on the same
(value, mesh axis).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
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
    """Placements on some mesh axes for every value whose name matches `pattern`."""

    pattern: str
    placements: tuple[tuple[str, Placement], ...]
    source: str = "user"

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
        return {
            "pattern": self.pattern,
            "placements": {a: str(p) for a, p in self.placements},
            "source": self.source,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], mesh: Mesh) -> Annotation:
        pattern = data.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise StrategyError(f"annotation {dict(data)!r} lacks a 'pattern'")
        raw = data.get("placements")
        if isinstance(raw, str):
            return cls.parse(f"{pattern}={raw}", mesh, str(data.get("source", "user")))
        if not isinstance(raw, Mapping) or not raw:
            raise StrategyError(
                f"annotation {pattern!r}: 'placements' must be a text form or an object "
                "mapping mesh axes to placements"
            )
        text = ",".join(f"{a}:{p}" for a, p in raw.items())
        return cls(
            pattern, parse_axis_placements(text, mesh, pattern), str(data.get("source", "user"))
        )


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


#: The options a strategy may carry: the optimization passes to run (names and options are
#: checked by `passes.manager.resolve_passes`), the optimizer and its learning rate.
OPTIONS = ("passes", "optimizer", "lr")


def check_options(options: Mapping[str, Any]) -> None:
    """Raise a `StrategyError` naming the first option that is unknown or out of range."""
    from shardlab.autodiff import OPTIMIZERS

    for key in options:
        if key not in OPTIONS:
            raise StrategyError(
                f"unknown strategy option {key!r}; options: {', '.join(OPTIONS)}", option=key
            )
    optimizer = options.get("optimizer", "adamw")
    if optimizer not in OPTIMIZERS:
        raise StrategyError(
            f"option 'optimizer' must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}",
            option="optimizer",
        )
    lr = options.get("lr", 1e-3)
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not 0 < lr < float("inf"):
        raise StrategyError(
            f"option 'lr' must be a positive number, got {lr!r}", option="lr", value=lr
        )


@dataclass(frozen=True, slots=True)
class Strategy:
    """Mesh + templates + annotations + options: everything completion needs."""

    mesh: Mesh
    templates: tuple[TemplateUse, ...] = ()
    annotations: tuple[Annotation, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        mesh: Mesh | str,
        templates: Sequence[str] = (),
        annotations: Sequence[str] = (),
        options: Mapping[str, Any] | None = None,
    ) -> Strategy:
        """From CLI-style text: `--mesh dp=2,tp=4 --template dp --annotate 'w=S(0)R'`."""
        from shardlab.templates import resolve_template

        mesh = Mesh.parse(mesh) if isinstance(mesh, str) else mesh
        uses = tuple(resolve_template(t, mesh) for t in templates)
        anns = tuple(Annotation.parse(a, mesh) for a in annotations)
        check_options(options or {})
        return cls(mesh, uses, anns, dict(options or {}))

    def to_json(self) -> dict[str, Any]:
        return {
            "mesh": self.mesh.to_json(),
            "templates": [{"name": t.name, "axis": t.axis} for t in self.templates],
            "annotations": [a.to_json() for a in self.annotations],
            "options": self.options,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Strategy:
        from shardlab.templates import resolve_template

        if not isinstance(data, Mapping) or "mesh" not in data:
            raise StrategyError("a strategy must be an object with a 'mesh'")
        raw_mesh = data["mesh"]
        mesh = Mesh.parse(raw_mesh) if isinstance(raw_mesh, str) else Mesh.from_json(raw_mesh)
        uses = []
        for t in data.get("templates", []):
            text = t if isinstance(t, str) else f"{t.get('name')}:{t.get('axis')}"
            uses.append(resolve_template(text, mesh))
        anns = []
        for a in data.get("annotations", []):
            anns.append(
                Annotation.parse(a, mesh) if isinstance(a, str) else Annotation.from_json(a, mesh)
            )
        options = data.get("options", {})
        if not isinstance(options, Mapping):
            raise StrategyError("strategy 'options' must be an object")
        check_options(options)
        return cls(mesh, tuple(uses), tuple(anns), dict(options))

    def describe(self) -> str:
        parts = [f"mesh {self.mesh}"]
        parts += [f"template {t}" for t in self.templates]
        parts += [f"annotate {a.text()}" for a in self.annotations]
        return "; ".join(parts)
