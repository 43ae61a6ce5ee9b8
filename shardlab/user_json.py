"""Checks every JSON document from a user passes before it is parsed further or stored.

Two things a document may not hold, whatever its schema:

- control characters (C0, U+0000..U+001F, and DEL, U+007F) in any string, dict keys
  included: PostgreSQL's text columns cannot hold NUL, and names with control characters
  cannot be shown, searched or typed. Free text (a comment's body) may hold tab, newline and
  carriage return; `free_text` names the top-level keys whose values are free text;
- nesting deeper than `MAX_JSON_DEPTH` containers (no graph, cluster or strategy document
  comes near it; Python's parsers and encoders fail at about 1000).

`json_problem` walks the document without recursion (a quick pass first; only a document
with a problem is walked again keeping paths) and answers the first problem with the path
(keys and list indices from the root) where it is.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

#: The most containers (objects, arrays) nested in one another in a user's JSON document.
MAX_JSON_DEPTH = 64
#: Control characters nowhere allowed: C0 and DEL.
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: Control characters free text may not hold either: all but tab, newline, carriage return.
FREE_TEXT_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

#: Where in a document: object keys and array indices from its root.
JsonPath = tuple[str | int, ...]
ProblemKind = Literal["control_character", "too_deep"]


@dataclass(frozen=True, slots=True)
class JsonProblem:
    """What is wrong (`message`) and where (`path`; the object holding a bad key)."""

    kind: ProblemKind
    path: JsonPath
    message: str


def codepoint(char: str) -> str:
    """'U+0000' for NUL."""
    return f"U+{ord(char):04X}"


def control_character(text: str, free_text: bool = False) -> str | None:
    """The first control character of `text` not allowed there, or None."""
    found = (FREE_TEXT_CONTROL if free_text else CONTROL).search(text)
    return found.group() if found else None


def string_problem(text: str, path: JsonPath = (), free_text: bool = False) -> JsonProblem | None:
    """A control character in the string `text` (at `path`), or None."""
    char = control_character(text, free_text)
    if char is None:
        return None
    allowed = "control characters are not allowed"
    if free_text:
        allowed = "only tab, newline and carriage return are allowed here"
    message = f"{text[:60]!r} contains the control character {codepoint(char)}; {allowed}"
    return JsonProblem("control_character", path, message)


def too_deep(max_depth: int = MAX_JSON_DEPTH) -> JsonProblem:
    """The problem of a document nested deeper than `max_depth` containers."""
    return JsonProblem("too_deep", (), f"nested too deeply (more than {max_depth} levels)")


def json_problem(
    document: Any, free_text: Collection[str] = (), max_depth: int = MAX_JSON_DEPTH
) -> JsonProblem | None:
    """The first control character or the excess nesting of `document`, or None.

    `free_text`: top-level keys whose string values may hold tab, newline and CR."""
    if _plainly_clean(document, max_depth):
        return None
    stack: list[tuple[JsonPath, Any, int]] = [((), document, 0)]
    while stack:
        path, node, depth = stack.pop()
        if isinstance(node, str):
            free = len(path) == 1 and path[0] in free_text
            problem = string_problem(node, path, free)
        elif isinstance(node, dict | list):
            if depth >= max_depth:
                return too_deep(max_depth)
            problem = _children(node, path, depth, stack)
        else:
            problem = None
        if problem is not None:
            return problem
    return None


def _plainly_clean(document: Any, max_depth: int) -> bool:
    """Whether no string (key or value) holds any control character and the nesting is
    within `max_depth`: the quick pass over a large clean document (a graph of thousands of
    ops), without the paths `json_problem` keeps to name where a problem is."""
    search = CONTROL.search
    stack: list[tuple[Any, int]] = [(document, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            if search(node):
                return False
            continue
        if not isinstance(node, dict | list):
            continue
        if depth >= max_depth:
            return False
        if isinstance(node, dict):
            if not all(isinstance(key, str) for key in node) or search("".join(node)):
                return False
            node = node.values()
        for item in node:
            if isinstance(item, str):
                if search(item):
                    return False
            elif isinstance(item, dict | list):
                stack.append((item, depth + 1))
    return True


def _children(
    node: dict[Any, Any] | list[Any],
    path: JsonPath,
    depth: int,
    stack: list[tuple[JsonPath, Any, int]],
) -> JsonProblem | None:
    """Push the items of `node` (in reverse, so the first is checked first); a key with a
    control character is the problem."""
    items: list[tuple[str | int, Any]] = (
        list(node.items()) if isinstance(node, dict) else list(enumerate(node))
    )
    for key, _ in items:
        if isinstance(key, str) and control_character(key) is not None:
            bad = string_problem(key, path)
            assert bad is not None
            return JsonProblem(bad.kind, path, f"the key {bad.message}")
    stack.extend(((*path, key), value, depth + 1) for key, value in reversed(items))
    return None


def path_text(path: JsonPath) -> str:
    """`ops.0.name`: keys joined by dots; a key that is not a plain word is shown quoted."""
    return ".".join(str(part) if _plain(part) else repr(part) for part in path)


def _plain(part: str | int) -> bool:
    return isinstance(part, int) or (part.replace("-", "_").isidentifier() and part.isascii())
