"""Stored JSON: large artifacts compressed (JSON -> zlib bytes and back), and the reader of
every stored JSON document (blobs and the databases' JSON columns, `backend.db`).

`loads_stored` never fails on what was stored: a record written before the door refused
lone surrogates and non-finite numbers (`shardlab.user_json`) reads with U+FFFD and null in
their place (`user_json.readable`), so it cannot break its own reads. The scan for them is a
regular expression over the raw text, so clean documents pay no walk.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

from shardlab.user_json import readable

#: what a stored document holds where it may hold a lone surrogate (as a JSON escape, or
#: raw where a driver hands the text over unescaped) or a number the door refuses (NaN,
#: Infinity, an exponent that reads as infinity, an integer of 19 digits or more); a match
#: only sends the document through `readable`, which decides
_SUSPECT = r"\\u[dD][89a-fA-F]|NaN|Infinity|[eE]\+?[0-9]{3}|[0-9]{19}"
_UNREADABLE = re.compile(_SUSPECT + "|[\ud800-\udfff]")
_UNREADABLE_BYTES = re.compile(_SUSPECT.encode())


def pack(value: Any) -> tuple[bytes, int]:
    """(zlib-compressed compact JSON, its uncompressed size)."""
    raw = json.dumps(value, separators=(",", ":")).encode()
    return zlib.compress(raw, 6), len(raw)


def unpack(data: bytes) -> Any:
    return loads_stored(zlib.decompress(data))


def loads_stored(raw: str | bytes | bytearray) -> Any:
    """The JSON document `raw`, readable whatever it holds (module docstring)."""
    value = json.loads(raw)
    pattern = _UNREADABLE if isinstance(raw, str) else _UNREADABLE_BYTES
    if pattern.search(raw):  # type: ignore[arg-type]
        return readable(value)
    return value
