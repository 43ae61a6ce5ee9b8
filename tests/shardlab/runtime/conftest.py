"""Fixtures of the runtime tests: `faults`, the torch backend's fault injection module."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="session")
def faults() -> ModuleType:
    """`torch_faults.py` beside this file (tests are not a package), loaded once."""
    path = Path(__file__).with_name("torch_faults.py")
    spec = importlib.util.spec_from_file_location("torch_faults", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
