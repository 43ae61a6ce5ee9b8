"""User text in the files an export writes, only ever as text: never as code.

Every name an export prints came from a user (a model's, a value's or parameter's, a scope,
a cluster, a strategy's annotation globs) and may hold anything, `\"\"\"` and line breaks
included. A name that ends a docstring, a string or a comment early turns the rest of it
into code that runs when a teammate imports the module. So each kind of place has its one
writer here, and the exports write user text through them only:

- `py_str`: a Python string literal (double-quoted, ASCII: every other character escaped);
- `doc_text`: a line inside a `\"\"\"` docstring: backslashes and double quotes escaped, so
  no quote run can close it, and every unprintable character (line breaks too) escaped;
- `comment_text`: the rest of a `#` comment line (Python or TOML): every unprintable
  character escaped, so it cannot break the line;
- `toml_str`: a TOML basic string (TOML has no lone surrogates: those become U+FFFD);
- `sh_arg`: one shell word (`shlex.quote`: single-quoted unless it is plain), for the
  argument exports (torchtitan's command line, Megatron-LM's); a word holding a line break
  or another unprintable character is refused, since an argument file has one option a line.

Reading the escaped text back (the docstring's value, the string's) gives the user's text
again, except for what `comment_text` shows escaped.
"""

from __future__ import annotations

import json
import shlex

from shardlab.errors import ShardlabError


def py_str(text: str) -> str:
    """`text` as a Python string literal (JSON's escapes are Python's)."""
    return json.dumps(text)


def _escaped(char: str) -> str:
    """The backslash escape of one unprintable character, as Python writes it."""
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def comment_text(text: str) -> str:
    """`text` for a comment line: printable characters kept, every other one escaped."""
    return "".join(c if c.isprintable() else _escaped(c) for c in text)


def doc_text(text: str) -> str:
    """`text` for a line of a docstring: `\\` and `"` escaped too, so neither an escape nor a
    run of quotes in a name can end the docstring or change what it reads."""
    out = []
    for c in text:
        if c in '\\"':
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        else:
            out.append(_escaped(c))
    return "".join(out)


#: what TOML's basic strings must escape besides the control characters
_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
                 "\r": "\\r"}  # fmt: skip


def toml_str(text: str) -> str:
    """`text` as a TOML basic string."""
    out = ['"']
    for c in text:
        code = ord(c)
        if c in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[c])
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\\uFFFD")
        elif code < 0x20 or code == 0x7F or not c.isprintable():
            out.append(f"\\u{code:04X}" if code <= 0xFFFF else f"\\U{code:08X}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def sh_arg(text: str) -> str:
    """`text` as one shell word; an unprintable character (a line break) is refused, since
    the argument exports keep one option on a line."""
    bad = next((c for c in text if not c.isprintable()), None)
    if bad is not None:
        raise ShardlabError(
            f"the argument {comment_text(text)!r} holds {_escaped(bad)!r}, which an argument "
            "file cannot hold on one line",
            argument=comment_text(text),
        )
    return shlex.quote(text)
