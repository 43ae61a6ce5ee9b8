"""Fixtures every test directory may use: the migrated databases of `tests/databases.py`, and
one local Ray per test process."""

from collections.abc import Iterator
from typing import Any

import pytest

from tests.databases import postgres_admin, sqlite_template

__all__ = ["local_ray", "postgres_admin", "sqlite_template"]


@pytest.fixture(scope="session")
def local_ray() -> Iterator[Any]:
    """A local Ray of 2 CPUs (`ray.init(num_cpus=2)`), started once per test process and
    shared by every test that needs one: Ray started again in a process that shut one down
    crashed that process (a core-worker check in Ray's task manager), killing its pytest
    worker."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 1024**2,
             log_to_driver=False)  # fmt: skip
    try:
        yield ray
    finally:
        ray.shutdown()
