"""The `shardlab` command: one module per group of commands, all on one Typer app.

`MODEL` arguments are a preset name (`llama3-8b`) or the path of a graph JSON file;
`--set key=value` overrides preset fields. User errors print one line naming the culprit
and exit with status 1.
"""

from shardlab.cli import (  # noqa: F401  (register commands)
    db_cmd,
    model_cmds,
    plan_cmd,
    serve_cmd,
    sharding_cmds,
    token_cmd,
    verify_cmd,
    worker_cmd,
)
from shardlab.cli.common import app

__all__ = ["app"]
