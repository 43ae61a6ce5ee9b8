"""Database engine and sessions: SQLite by default, PostgreSQL through `SHARDLAB_DATABASE_URL`.

PostgreSQL URLs `postgresql://...` use the psycopg 3 driver. SQLite gets foreign keys on,
a busy timeout, and WAL so that a worker writing progress does not block readers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from backend.blobs import loads_stored


def normalize_url(url: str) -> str:
    """`postgresql://` and `postgres://` mean psycopg 3."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def make_engine(url: str, pool_size: int | None = None) -> Engine:
    """An engine for `url` with the pragmas and pool settings each database needs;
    `pool_size` connections (and as many again in overflow) where a service sets it. JSON
    columns read through `blobs.loads_stored`: no stored record breaks its own reads."""
    url = normalize_url(url)
    pool: dict[str, Any] = {}
    in_memory = url.startswith("sqlite") and (":memory:" in url or url.rstrip("/") == "sqlite:")
    if pool_size is not None and not in_memory:  # an in-memory database has one connection
        pool = {"pool_size": pool_size, "max_overflow": pool_size, "pool_timeout": 10}
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            json_deserializer=loads_stored,
            **pool,
        )

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _: Any) -> None:
            # the driver's own transaction handling would defeat BEGIN IMMEDIATE; see `begin`
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Any) -> None:
            immediate = conn.get_execution_options().get("sqlite_immediate", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine
    return create_engine(url, pool_pre_ping=True, json_deserializer=loads_stored, **pool)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session], immediate: bool = False) -> Iterator[Session]:
    """A session whose work commits at the end of the block, or rolls back on any error.

    `immediate` takes SQLite's write lock at BEGIN (so two workers cannot claim one job);
    PostgreSQL uses row locks (`FOR UPDATE SKIP LOCKED`) instead and ignores it.
    """
    with factory() as session:
        if immediate:
            session.connection(execution_options={"sqlite_immediate": True})
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
