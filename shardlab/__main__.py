"""`python -m shardlab ...` runs the `shardlab` command (used to start worker processes)."""

from shardlab.cli import app

app()
