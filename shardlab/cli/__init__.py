"""The `shardlab` command: one module per group of commands, all on one Typer app.

`MODEL` arguments are a preset name (`llama3-8b`) or the path of a graph JSON file;
`--set key=value` overrides preset fields. User errors print one line naming the culprit
and exit with status 1. The service's commands (serve, worker, db, token) are added by
`backend.cli`, which is what the installed `shardlab` script runs.
"""

from shardlab.cli import (  # noqa: F401  (register commands)
    calibrate_cmd,
    check_cmd,
    export_cmd,
    import_cmd,
    measure_cmd,
    model_cmds,
    plan_cmd,
    search_cmd,
    sharding_cmds,
    verify_cmd,
)
from shardlab.cli.common import app

__all__ = ["app"]
