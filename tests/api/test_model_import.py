"""Importing a Hugging Face config over REST: `POST /api/models/import` queues an `import`
job (202), the worker builds the model with transformers on the meta device and stores it
as any model; its parameter count is transformers' own. An unsupported architecture fails
the job naming the field and stores nothing; malformed bodies are 4xx `{code, message,
detail}` naming the field, with nothing stored (no job, no model). The web process never
imports torch or transformers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from backend.db import make_engine, session_factory
from backend.orm import Job, Model
from backend.settings import Settings
from tests.api.conftest import assert_error
from tests.api.test_plans import run_jobs

ROOT = Path(__file__).resolve().parents[2]

#: a tiny Llama: hidden 32, 2 layers, vocabulary 64, 4 heads, MLP 64
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 32,
         "num_hidden_layers": 2, "vocab_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 4, "intermediate_size": 64, "max_position_embeddings": 128,
         "rms_norm_eps": 1e-6, "tie_word_embeddings": False}  # fmt: skip
#: a tiny GPT-2 (its output projection is tied to the token embedding)
GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 32, "n_layer": 2,
        "n_head": 4, "vocab_size": 64, "n_positions": 32, "bos_token_id": 0,
        "eos_token_id": 0}  # fmt: skip


def transformers_params(config: dict[str, Any]) -> int:
    """The parameter count transformers gives the config's causal LM, built on meta."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    hf_config = transformers.AutoConfig.for_model(config["model_type"], **fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return int(model.num_parameters())


def _counts(settings: Settings) -> tuple[int, int]:
    """(jobs, models) stored."""
    engine = make_engine(settings.database_url)
    try:
        with session_factory(engine)() as session:
            jobs = session.scalar(select(func.count()).select_from(Job)) or 0
            models = session.scalar(select(func.count()).select_from(Model)) or 0
            return jobs, models
    finally:
        engine.dispose()


def _import(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    answer = client.post("/api/models/import", json=body)
    assert answer.status_code == 202, answer.text
    created: dict[str, Any] = answer.json()
    assert created["status"] == "queued"
    return created


def test_llama_and_gpt2_configs_import_with_transformers_parameter_counts(
    client: TestClient, settings: Settings
) -> None:
    llama = _import(client, {"config": LLAMA, "name": "tiny-llama", "batch": 2, "seq": 16})
    assert llama["name"] == "tiny-llama" and llama["model_type"] == "llama"
    gpt2 = _import(client, {"config": GPT2})  # unnamed: its architecture; seq: n_positions
    assert gpt2["name"] == "GPT2LMHeadModel"
    queued = client.get(f"/api/jobs/{llama['job_id']}").json()
    assert queued["kind"] == "import" and queued["status"] == "queued"
    assert queued["payload"]["config"] == LLAMA and queued["requires"] is None
    assert _counts(settings) == (2, 0)

    assert run_jobs(settings) == 2
    for created, config, name in ((llama, LLAMA, "tiny-llama"), (gpt2, GPT2, "GPT2LMHeadModel")):
        job = client.get(f"/api/jobs/{created['job_id']}").json()
        assert job["status"] == "succeeded", job
        assert job["progress"] == 1.0 and job["error"] is None
        model = client.get(f"/api/models/{job['result']['model_id']}").json()
        expected = transformers_params(config)
        assert model["name"] == job["result"]["name"] == name
        assert model["source"] == "hf_config" and model["preset"] is None
        assert model["params"] == job["result"]["params"] == expected, (name, expected)
        assert model["ops"] == job["result"]["ops"] > 0
        assert model["flops_forward"] > 0
    assert client.get(f"/api/models/{job['result']['model_id']}").json()["overrides"] == {
        "batch": 1
    }
    llama_model, gpt2_model = client.get("/api/models").json()[:2]
    # `layers` counts numbered layers: Llama's `model.layers.N`, GPT-2's `transformer.h.N`
    assert llama_model["layers"] == 2
    assert gpt2_model["layers"] == 2, gpt2_model
    assert llama_model["overrides"] == {"batch": 2, "seq": 16}
    graph = client.get(f"/api/models/{llama_model['id']}/graph").json()
    assert graph["ops"] and graph["values"]
    assert _counts(settings) == (2, 2)

    # the same config again, unnamed: a name of its own
    again = _import(client, {"config": GPT2})
    assert run_jobs(settings) == 1
    job = client.get(f"/api/jobs/{again['job_id']}").json()
    assert job["status"] == "succeeded" and job["result"]["name"] == "GPT2LMHeadModel #2", job


@pytest.mark.parametrize("model_type", ["no_such_arch", "vit"])
def test_an_unsupported_architecture_fails_the_job_naming_the_field(
    client: TestClient, settings: Settings, model_type: str
) -> None:
    config = {**LLAMA, "model_type": model_type, "architectures": ["SomethingElse"]}
    created = _import(client, {"config": config, "name": "unsupported"})
    assert run_jobs(settings) == 1
    job = client.get(f"/api/jobs/{created['job_id']}").json()
    assert job["status"] == "failed", job
    error = job["error"]
    assert set(error) == {"code", "message", "detail"} and error["code"] == "import_error", error
    assert "model_type" in error["message"] and model_type in error["message"], error
    assert job["message"] == error["message"] and job["result"] is None
    assert client.get("/api/models").json() == []
    assert _counts(settings) == (1, 0)


BIG = {**LLAMA, "id2label": {str(i): "x" * 100 for i in range(11_000)}}  # over 1 MiB


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        ({"config": [LLAMA]}, 422, "invalid_request", "body.config"),
        ({"config": "llama"}, 422, "invalid_request", "body.config"),
        ({"name": "x"}, 422, "invalid_request", "body.config"),
        ({"config": {"hidden_size": 32}}, 422, "invalid_hf_config", "config.model_type"),
        ({"config": {**LLAMA, "model_type": 3}}, 422, "invalid_hf_config", "config.model_type"),
        ({"config": {**LLAMA, "model_type": " "}}, 422, "invalid_hf_config", "config.model_type"),
        ({"config": {**LLAMA, "model_type": None}}, 422, "invalid_hf_config", "config.model_type"),
        ({"config": LLAMA, "batch": 0}, 422, "invalid_request", "body.batch"),
        ({"config": LLAMA, "batch": "2"}, 422, "invalid_request", "body.batch"),
        ({"config": LLAMA, "batch": 1.5}, 422, "invalid_request", "body.batch"),
        ({"config": LLAMA, "seq": -1}, 422, "invalid_request", "body.seq"),
        ({"config": LLAMA, "seq": True}, 422, "invalid_request", "body.seq"),
        ({"config": LLAMA, "name": ""}, 422, "invalid_request", "body.name"),
        ({"config": LLAMA, "name": "   "}, 422, "invalid_hf_config", "name"),
        ({"config": LLAMA, "layers": 2}, 422, "invalid_request", "body.layers"),
        ({"config": {**LLAMA, "note": "a\x00b"}}, 422, "invalid_request", "body.config"),
        ({"config": BIG}, 413, "config_too_large", "config"),
    ],
)
def test_malformed_bodies_are_refused_naming_the_field_and_store_nothing(
    client: TestClient,
    settings: Settings,
    body: dict[str, Any],
    status: int,
    code: str,
    field: str,
) -> None:
    assert_error(client.post("/api/models/import", json=body), status, code, field)
    assert _counts(settings) == (0, 0)


def test_a_body_that_is_no_json_object_is_refused(client: TestClient, settings: Settings) -> None:
    answer = client.post("/api/models/import", content=b"[1, 2",
                         headers={"Content-Type": "application/json"})  # fmt: skip
    assert 400 <= answer.status_code < 500
    assert set(answer.json()) == {"code", "message", "detail"}
    assert _counts(settings) == (0, 0)


def test_a_taken_name_is_a_conflict_and_other_teams_see_nothing(
    client: TestClient, other_client: TestClient, settings: Settings
) -> None:
    made = client.post("/api/models", json={"name": "taken", "preset": "llama3-8b",
                                            "overrides": {"layers": 1}})  # fmt: skip
    assert made.status_code == 201, made.text
    answer = client.post("/api/models/import", json={"config": LLAMA, "name": "taken"})
    assert_error(answer, 409, "conflict", "taken")
    assert _counts(settings) == (0, 1)
    created = _import(other_client, {"config": LLAMA, "name": "taken"})  # beta's own names
    assert_error(client.get(f"/api/jobs/{created['job_id']}"), 404, "not_found", "job")


def test_the_import_route_is_documented(app: FastAPI) -> None:
    schema = app.openapi()
    operation = schema["paths"]["/api/models/import"]["post"]
    assert {"202", "401", "409", "413", "422", "429"} <= set(operation["responses"])
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("/HfImportCreate")
    fields = schema["components"]["schemas"]["HfImportCreate"]
    assert fields["required"] == ["config"] and set(fields["properties"]) == {
        "config", "name", "batch", "seq"}  # fmt: skip


def test_the_web_process_never_imports_torch_or_transformers() -> None:
    script = (
        "import sys\n"
        "from backend.app import create_app\n"
        "import backend.routers.model_import, backend.schemas.model_import\n"
        "loaded = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
        "print(loaded)\n"
        "sys.exit(1 if loaded else 0)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=False)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    for path in (ROOT / "backend").rglob("*.py"):
        text = path.read_text()
        for module in ("torch", "transformers"):
            assert f"import {module}" not in text and f"from {module}" not in text, path
