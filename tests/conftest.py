"""Fixtures every test directory may use: the migrated databases of `tests/databases.py`."""

from tests.databases import postgres_admin, sqlite_template

__all__ = ["postgres_admin", "sqlite_template"]
