"""Schemas of importing a model from a Hugging Face `config.json` (`POST /api/models/import`).

The request carries the config as a JSON object; what can be checked without torch or
transformers is checked here and in `backend/routers/model_import.py`; the worker's `import`
job builds the model (`worker/importing.py`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from backend.schemas.common import StrictRequest
from backend.schemas.jobs import JobStatus

#: the largest batch or sequence length an import may ask for (the engine bounds the shapes
#: they make, `shardlab.ir.MAX_ELEMENTS`; this only keeps the numbers sane)
MAX_BATCH = 1_048_576
MAX_SEQ = 16_777_216


class HfImportCreate(StrictRequest):
    """A Hugging Face config to build on the meta device and import as a model."""

    config: dict[str, Any] = Field(
        description="The model's `config.json` as a JSON object; `model_type` (e.g. 'llama', "
        "'gpt2') names its architecture."
    )
    name: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="The model's name (409 if the team has it). Default: the config's "
        "`_name_or_path`, else its architecture, made unique with ' #2', ' #3', ...",
    )
    batch: int = Field(1, ge=1, le=MAX_BATCH, description="Sequences per step of the graph.")
    seq: int | None = Field(
        None,
        ge=1,
        le=MAX_SEQ,
        description="Tokens per sequence. Default: the config's own context length.",
    )


class HfImportCreated(BaseModel):
    """An import queued (202): follow `job_id` (`GET /api/jobs/{id}`, its `result.model_id`
    once succeeded, its `error` {code, message, detail} once failed)."""

    job_id: int
    status: JobStatus
    name: str = Field(description="The name asked for, or the base of the default name.")
    model_type: str = Field(description="The config's `model_type`.")
