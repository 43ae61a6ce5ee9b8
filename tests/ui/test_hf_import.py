"""The models view's "Import Hugging Face config": a config.json file (or pasted JSON), an
optional batch and sequence length; the import job's progress, then the new model in the
table with transformers' parameter count, or the job's error naming the config's field next
to the config. Refused input (a config without `model_type`, a batch of 0) is shown next to
its field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.ui.conftest import Server, screenshot
from tests.ui.refusals import error_of, refusing_page

#: a tiny Llama: hidden 32, 2 layers, vocabulary 64, 4 heads, MLP 64
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 32,
         "num_hidden_layers": 2, "vocab_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 4, "intermediate_size": 64, "max_position_embeddings": 64,
         "tie_word_embeddings": False}  # fmt: skip
FILE = json.dumps(LLAMA, indent=2)
#: how long the worker may take (it loads torch and transformers for the job)
JOB_MS = 120_000


@pytest.fixture
def page(browser: Browser, server: Server, storage_state: str) -> Iterator[Page]:
    """A logged-in page that lets the 422 answers these tests provoke through."""
    yield from refusing_page(browser, server, storage_state)


def transformers_params(config: dict[str, Any]) -> int:
    """transformers' parameter count of the config's causal LM, built on meta."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(config["model_type"], **fields)
        )
    return int(model.num_parameters())


def _form(page: Page) -> Locator:
    page.goto("/#/models")
    return page.get_by_role("form", name="Import Hugging Face config")


def test_import_a_config_file_and_see_the_model(page: Page, server: Server) -> None:
    form = _form(page)
    form.get_by_label("config.json file").set_input_files(
        {"name": "config.json", "mimeType": "application/json", "buffer": FILE.encode()}
    )
    config = form.get_by_label("Config JSON")
    expect(config).to_have_value(FILE)
    form.get_by_label("Name").fill("ui-hf-llama")
    form.get_by_label("Batch").fill("2")
    form.get_by_label("Sequence length").fill("16")
    form.get_by_role("button", name="Import").click()

    status = page.get_by_role("status").first
    expect(status).to_contain_text("Created model ui-hf-llama", timeout=JOB_MS)
    made = [m for m in server.api("GET", "/api/models") if m["name"] == "ui-hf-llama"]
    assert len(made) == 1 and made[0]["source"] == "hf_config", made
    expected = transformers_params(LLAMA)
    assert made[0]["params"] == expected and made[0]["overrides"] == {"batch": 2, "seq": 16}
    row = page.get_by_role("table", name="models").locator(f'tr[data-model-id="{made[0]["id"]}"]')
    expect(row.locator('td[data-col="params"]')).to_have_text(f"{expected:,}")
    expect(row).to_contain_text("hf_config")
    expect(row).to_have_attribute("aria-current", "true")
    expect(config).to_have_value("")  # the form is reset for the next import
    form.scroll_into_view_if_needed()
    screenshot(page, "models-hf-import")
    jobs = [j for j in server.api("GET", "/api/jobs") if j["kind"] == "import"]
    assert jobs[0]["status"] == "succeeded" and jobs[0]["result"]["model_id"] == made[0]["id"]


def test_an_unsupported_architecture_shows_the_jobs_error_next_to_the_config(
    page: Page, server: Server
) -> None:
    before = len(server.api("GET", "/api/models"))
    form = _form(page)
    config = form.get_by_label("Config JSON")
    config.fill(json.dumps({**LLAMA, "model_type": "no_such_arch"}))
    form.get_by_role("button", name="Import").click()
    expect(config).to_have_attribute("aria-invalid", "true", timeout=JOB_MS)
    line = error_of(page, config)
    expect(line).to_contain_text("import failed")
    expect(line).to_contain_text("model_type")
    failed = next(j for j in server.api("GET", "/api/jobs") if j["kind"] == "import")
    assert failed["status"] == "failed" and failed["error"]["code"] == "import_error", failed
    expect(line).to_contain_text(failed["error"]["message"])
    assert len(server.api("GET", "/api/models")) == before


def test_refused_input_is_shown_next_to_its_field(page: Page, server: Server) -> None:
    jobs = len(server.api("GET", "/api/jobs"))
    form = _form(page)
    config = form.get_by_label("Config JSON")

    config.fill(json.dumps({k: v for k, v in LLAMA.items() if k != "model_type"}))
    form.get_by_role("button", name="Import").click()  # the API's 422 naming the field
    expect(config).to_have_attribute("aria-invalid", "true")
    expect(error_of(page, config)).to_contain_text("config.model_type: missing")
    expect(config).to_be_focused()

    config.fill("[1, 2]")  # not an object: refused before any request
    form.get_by_role("button", name="Import").click()
    expect(error_of(page, config)).to_contain_text("must be a JSON object")

    config.fill(json.dumps(LLAMA))
    batch = form.get_by_label("Batch")
    batch.fill("0")
    form.get_by_role("button", name="Import").click()
    expect(batch).to_have_attribute("aria-invalid", "true")
    expect(error_of(page, batch)).to_contain_text("batch must be a positive whole number")
    expect(config).not_to_have_attribute("aria-invalid", "true")
    assert len(server.api("GET", "/api/jobs")) == jobs
