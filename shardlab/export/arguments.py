"""The argument exports' file: a framework's command-line options, one a line.

What it is for: `export.torchtitan` and `export.megatron` both write how a framework's own
launcher should run a plan as its command-line options. `ArgumentFile` holds them: header
comment lines (user text only through `literals.comment_text`), then one option and its
values a line, each word through `literals.sh_arg`, so the file's non-comment lines can be
handed to the launcher as they are (`$(grep -v '^#' FILE)`), and `notes` (what the export
maps to what the framework runs, and what it cannot say), which the CLI prints and the
service sends in a header.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardlab.export.literals import comment_text, sh_arg


@dataclass
class ArgumentFile:
    """A framework's options for a plan, and what the user should read."""

    args: list[list[str]]  # one option and its values per entry, in order
    comments: list[str] = field(default_factory=list)  # the file's header, text only
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        lines = [f"# {comment_text(c)}" for c in self.comments]
        lines += [" ".join(sh_arg(a) for a in arg) for arg in self.args]
        return "\n".join(lines) + "\n"

    def argv(self) -> list[str]:
        """The options as one argument list (what a parser's `parse_args` takes)."""
        return [a for arg in self.args for a in arg]

    def options(self) -> dict[str, list[str]]:
        """Option -> its values (a flag: no values)."""
        return {arg[0]: arg[1:] for arg in self.args}
