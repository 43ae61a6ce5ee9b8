"""`python -m backend ...` runs the full `shardlab` command (serve starts workers this way)."""

from backend.cli import app

app()
