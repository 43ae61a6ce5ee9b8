"""The command line's help lists what the registries hold: every template, every pass."""

from __future__ import annotations

from typer.testing import CliRunner

from shardlab.cli import app
from shardlab.passes.manager import PASSES
from shardlab.templates import TEMPLATES


def _flat(text: str) -> str:
    """Help text without the box drawing and line breaks rich adds."""
    return " ".join(text.replace("│", " ").split())


def test_plan_help_names_every_template_and_pass() -> None:
    result = CliRunner().invoke(app, ["plan", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = _flat(result.output)
    assert f"in order): {', '.join(TEMPLATES)}." in text
    assert {"zero1", "zero2", "zero3"} <= set(TEMPLATES)
    assert f"Turn a pass off (repeatable): {', '.join([*PASSES, 'pipeline_send_wait'])}." in text
