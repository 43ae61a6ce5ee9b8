"""Checks every JSON document from a user passes before it is parsed further or stored.

What a document may not hold, whatever its schema:

- control characters (C0, U+0000..U+001F, and DEL, U+007F) in any string, dict keys
  included: PostgreSQL's text columns cannot hold NUL, and names with control characters
  cannot be shown, searched or typed. Free text (a comment's body) may hold tab, newline and
  carriage return; `free_text` names the top-level keys whose values are free text;
- lone surrogates (U+D800..U+DFFF: `"\\ud800"` is a valid JSON escape, but no Unicode
  text): they cannot be encoded as UTF-8, so no database, log or answer could hold them;
- numbers JSON has no form for (`NaN`, `Infinity`, and `1e309`, which parses as infinity),
  and integers beyond a signed 64-bit integer (`MAX_JSON_INT`): no column or engine field
  holds them;
- nesting deeper than `MAX_JSON_DEPTH` containers (no graph, cluster or strategy document
  comes near it; Python's parsers and encoders fail at about 1000).

`json_problem` walks the document without recursion (a quick pass first; only a document
with a problem is walked again keeping paths) and answers the first problem with the path
(keys and list indices from the root) where it is.

`readable` is the other side: what was stored before these checks existed (or came from
elsewhere) is answered with each lone surrogate as U+FFFD and each number the checks refuse
as null, so no stored record can break its own reads.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

#: The most containers (objects, arrays) nested in one another in a user's JSON document.
MAX_JSON_DEPTH = 64
#: The largest magnitude of an integer in a user's document (a signed 64-bit integer).
MAX_JSON_INT = 2**63 - 1
#: Control characters nowhere allowed: C0 and DEL.
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: Control characters free text may not hold either: all but tab, newline, carriage return.
FREE_TEXT_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
#: Lone surrogates: a str may hold them, UTF-8 cannot.
SURROGATE = re.compile("[\ud800-\udfff]")
#: What the quick pass looks for in every string: a control character or a lone surrogate.
_UNSAFE = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")

#: Where in a document: object keys and array indices from its root.
JsonPath = tuple[str | int, ...]
ProblemKind = Literal[
    "control_character", "invalid_unicode", "not_finite", "int_out_of_range", "too_deep"
]


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
    """A lone surrogate or a control character in the string `text` (at `path`), or None."""
    surrogate = SURROGATE.search(text)
    if surrogate is not None:
        message = (f"{text[:60]!r} is not valid Unicode: it holds the lone surrogate "
                   f"{codepoint(surrogate.group())}, which no UTF-8 text can")  # fmt: skip
        return JsonProblem("invalid_unicode", path, message)
    char = control_character(text, free_text)
    if char is None:
        return None
    allowed = "control characters are not allowed"
    if free_text:
        allowed = "only tab, newline and carriage return are allowed here"
    message = f"{text[:60]!r} contains the control character {codepoint(char)}; {allowed}"
    return JsonProblem("control_character", path, message)


def number_problem(number: object, path: JsonPath = ()) -> JsonProblem | None:
    """A float JSON cannot write (NaN, infinity) or an integer beyond `MAX_JSON_INT`, or None."""
    if isinstance(number, float) and not math.isfinite(number):
        name = "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")
        message = (f"{name} is not a number JSON can hold: numbers must be finite "
                   "(1e309 and larger read as Infinity)")  # fmt: skip
        return JsonProblem("not_finite", path, message)
    if isinstance(number, int) and not isinstance(number, bool) and abs(number) > MAX_JSON_INT:
        digits = len(str(abs(number)))
        message = (f"an integer of {digits} digits is out of range: integers must be within "
                   f"+-{MAX_JSON_INT} (2^63 - 1)")  # fmt: skip
        return JsonProblem("int_out_of_range", path, message)
    return None


def _plain_number(node: object) -> bool:
    """Whether `node` is no number, or a number `number_problem` accepts (the quick pass)."""
    if isinstance(node, float):
        return math.isfinite(node)
    if isinstance(node, int):
        return -MAX_JSON_INT <= node <= MAX_JSON_INT
    return True


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
            problem = number_problem(node, path)
        if problem is not None:
            return problem
    return None


def _plainly_clean(document: Any, max_depth: int) -> bool:
    """Whether no string (key or value) holds any control character or lone surrogate, every
    number is one JSON can hold and the nesting is within `max_depth`: the quick pass over a
    large clean document (a graph of thousands of ops), without the paths `json_problem`
    keeps to name where a problem is."""
    search = _UNSAFE.search
    stack: list[tuple[Any, int]] = [(document, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            if search(node):
                return False
            continue
        if not isinstance(node, dict | list):
            if not _plain_number(node):
                return False
            continue
        if depth >= max_depth:
            return False
        if isinstance(node, dict):
            if not all(isinstance(key, str) for key in node) or search("".join(node)):
                return False
            node = node.values()
        for item in node:
            kind = type(item)
            if kind is int:  # the common case (shapes): compared inline
                if not -MAX_JSON_INT <= item <= MAX_JSON_INT:
                    return False
            elif kind is str:
                if search(item):
                    return False
            elif kind is dict or kind is list:
                stack.append((item, depth + 1))
            elif not _plain_number(item):
                return False
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
        bad = string_problem(key, path) if isinstance(key, str) else None
        if bad is not None:
            return JsonProblem(bad.kind, path, f"the key {bad.message}")
    stack.extend(((*path, key), value, depth + 1) for key, value in reversed(items))
    return None


def path_text(path: JsonPath) -> str:
    """`ops.0.name`: keys joined by dots; a key that is not a plain word is shown quoted."""
    return ".".join(str(part) if _plain(part) else repr(part) for part in path)


def _plain(part: str | int) -> bool:
    return isinstance(part, int) or (part.replace("-", "_").isidentifier() and part.isascii())


def readable(document: Any) -> Any:
    """`document` with every lone surrogate (in keys too) as U+FFFD and every number
    `number_problem` refuses (non-finite, or an integer past `MAX_JSON_INT`) as None: what
    any JSON encoder writes, any database stores and any float conversion takes. A document
    without any is returned as it is (the quick pass); nesting is not limited here."""
    if _plainly_readable(document):
        return document
    return _scrub(document)


def _plainly_readable(document: Any) -> bool:
    stack: list[Any] = [document]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if SURROGATE.search(node):
                return False
        elif isinstance(node, int | float):
            if not _plain_number(node):
                return False
        elif isinstance(node, dict):
            if any(SURROGATE.search(k) for k in node if isinstance(k, str)):
                return False
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
    return True


def _scrub(node: Any) -> Any:
    """The readable copy of `node` (recursive: stored documents were nested within limits)."""
    if isinstance(node, str):
        return SURROGATE.sub("\ufffd", node)
    if isinstance(node, int | float):
        return node if _plain_number(node) else None
    if isinstance(node, dict):
        return {_scrub(k) if isinstance(k, str) else k: _scrub(v) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return [_scrub(v) for v in node]
    return node
