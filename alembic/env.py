"""Alembic environment: the target metadata is `backend.orm.Base.metadata`; the URL comes
from the Alembic config (`backend.migrate` sets it from the settings)."""

from __future__ import annotations

from sqlalchemy import Connection

from alembic import context
from backend.db import make_engine
from backend.orm import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    engine = make_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()
