"""`python -m shardlab ...` runs the engine's commands (`python -m backend` adds the service's)."""

from shardlab.cli import app

app()
