"""The `import` job's worker side (`worker/importing.py`): a worker without torch or
transformers fails it saying what to install; the engine's graph is bounded by `max_ops`
and handed the payload's sizes; the outcome is stored through `add_model` (an unnamed import
made unique, a name taken meanwhile a failed job with nothing stored). The import end to end,
with transformers, is `tests/api/test_model_import.py`."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from backend import blobs, ledger
from backend.auth import ensure_team
from backend.db import transaction
from backend.orm import Model
from backend.settings import Settings
from shardlab.graph_json import graph_to_json
from shardlab.ir import Graph
from shardlab.models import build_model
from tests.worker.conftest import job_row, settings_for
from worker import importing
from worker.child import run_job
from worker.main import Worker

TINY = {"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 4, "ffn": 64, "vocab": 64,
        "seq": 8, "batch": 2}  # fmt: skip
CONFIG = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2}


def _inputs(**changes: Any) -> dict[str, Any]:
    inputs = {"config": CONFIG, "batch": 2, "seq": 8, "base_name": "tiny", "max_ops": 100_000}
    return {**inputs, **changes}


def _quiet(fraction: float, message: str) -> None:
    pass


def test_a_worker_without_transformers_fails_the_import_saying_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec

    def without_transformers(name: str, *args: Any) -> Any:
        return None if name == "transformers" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_transformers)
    state, error = run_job("import", _inputs(), _quiet)
    assert state == "error" and error["code"] == "importer_unavailable", error
    assert "transformers is not installed" in error["message"], error
    assert "shardlab[import]" in error["message"] and error["detail"] == {
        "missing": ["transformers"]
    }


def test_a_worker_without_the_importer_module_fails_the_import_saying_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(importing, "IMPORTER", "shardlab.no_such_package.hf_config")
    state, error = run_job("import", _inputs(), _quiet)
    assert state == "error" and error["code"] == "importer_unavailable", error
    assert "shardlab.no_such_package.hf_config" in error["message"]


def test_the_engine_gets_the_payload_sizes_and_its_graph_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[dict[str, Any]] = []

    def build(config: dict[str, Any], **sizes: Any) -> Graph:
        calls.append({"config": config, **sizes})
        return build_model("llama3-8b", TINY)

    monkeypatch.setattr(importing, "_importer", lambda: build)
    ops = len(build_model("llama3-8b", TINY).ops)
    state, data = run_job("import", _inputs(max_ops=ops), _quiet)
    assert state == "result" and len(data["graph"]["ops"]) == ops
    assert calls == [{"config": CONFIG, "batch": 2, "seq": 8, "name": "tiny"}]

    state, error = run_job("import", _inputs(max_ops=ops - 1, seq=None), _quiet)
    assert state == "error" and error["code"] == "graph_too_large", error
    assert f"{ops} ops, more than the limit of {ops - 1}" in error["message"]
    assert calls[-1]["seq"] is None


def _queue_import(
    factory: sessionmaker[Session], settings: Settings, name: str | None, base: str
) -> int:
    with transaction(factory) as session:
        team = ensure_team(session, "alpha")
        payload = {"config": CONFIG, "batch": 2, "seq": 8, "name": name, "base_name": base,
                   "max_ops": 100_000}  # fmt: skip
        return ledger.enqueue(session, settings, team.id, "import", payload).id


def _add_model(factory: sessionmaker[Session], name: str) -> None:
    blob, _ = blobs.pack(graph_to_json(build_model("llama3-8b", {"layers": 1})))
    with transaction(factory) as session:
        team = ensure_team(session, "alpha")
        session.add(Model(team_id=team.id, name=name, source="preset", preset="llama3-8b",
                          graph_blob=blob))  # fmt: skip


def _models(factory: sessionmaker[Session]) -> list[Model]:
    with factory() as session:
        return list(session.scalars(select(Model).order_by(Model.id)))


def _finish_with_graph(settings: Settings, graph: Graph) -> None:
    """Claim the queued import and record the engine's answer `graph` as the worker does."""
    worker = Worker(settings, "import-worker")
    try:
        job = ledger.claim(worker.factory, settings, worker.worker_id)
        assert job is not None and job.kind == "import"
        worker._record(job, "result", {"graph": graph_to_json(graph)})
    finally:
        worker.close()


def test_an_unnamed_import_is_stored_under_a_free_name(
    db_url: str, factory: sessionmaker[Session], tmp_path: Path
) -> None:
    settings = settings_for(db_url, tmp_path)
    _add_model(factory, "tiny")
    job_id = _queue_import(factory, settings, None, "tiny")
    graph = build_model("llama3-8b", TINY)
    _finish_with_graph(settings, graph)

    job = job_row(factory, job_id)
    assert job.status == "succeeded", (job.message, job.error)
    stored = _models(factory)[-1]
    assert job.result == {"model_id": stored.id, "name": "tiny #2", "model_type": "llama",
                          "params": graph.num_params(), "ops": len(graph.ops)}  # fmt: skip
    assert stored.name == "tiny #2" and stored.source == "hf_config" and stored.preset is None
    assert stored.overrides == {"batch": 2, "seq": 8}
    assert stored.summary["params"] == graph.num_params() and stored.summary["layers"] == 2
    assert blobs.unpack(stored.graph_blob) == graph_to_json(graph)


def test_a_name_taken_meanwhile_fails_the_import_and_stores_nothing(
    db_url: str, factory: sessionmaker[Session], tmp_path: Path
) -> None:
    settings = settings_for(db_url, tmp_path)
    job_id = _queue_import(factory, settings, "mine", "mine")
    _add_model(factory, "mine")  # after the API checked the name
    _finish_with_graph(settings, build_model("llama3-8b", TINY))

    job = job_row(factory, job_id)
    assert job.status == "failed" and job.error is not None
    assert job.error["code"] == "conflict" and "'mine'" in job.error["message"], job.error
    with factory() as session:
        assert session.scalar(select(func.count()).select_from(Model)) == 1
