"""Large artifacts stored compressed: JSON -> zlib bytes and back."""

from __future__ import annotations

import json
import zlib
from typing import Any


def pack(value: Any) -> tuple[bytes, int]:
    """(zlib-compressed compact JSON, its uncompressed size)."""
    raw = json.dumps(value, separators=(",", ":")).encode()
    return zlib.compress(raw, 6), len(raw)


def unpack(data: bytes) -> Any:
    return json.loads(zlib.decompress(data))
