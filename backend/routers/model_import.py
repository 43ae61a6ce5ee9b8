"""Importing a model from a Hugging Face `config.json`: `POST /api/models/import` (202).

The web process never imports torch or transformers, so building the model is a job: this
router checks what it can cheaply (the config a JSON object of at most `MAX_CONFIG_BYTES`,
its `model_type` present and a string, `batch` and `seq` positive ints, the asked name free)
and queues an `import` job; nothing else is stored. A worker with torch and transformers
(`worker/importing.py`) builds the model on the meta device
(`shardlab.importers.hf_config.graph_from_hf_config`) and stores it as `POST /api/models`
does (`backend/routers/models.add_model`); the job's `result.model_id` names it. A config the
importer refuses (an unsupported architecture, a missing field) fails the job with the
importer's `{code, message, detail}` naming the field, and no model is stored.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter
from sqlalchemy import select

from backend import ledger
from backend.deps import PrincipalDep, SessionDep, SettingsDep
from backend.errors import ApiError
from backend.orm import Model
from backend.schemas.common import errors
from backend.schemas.model_import import HfImportCreate, HfImportCreated
from shardlab.errors import ModelImportError
from shardlab.importers.hf_config import check_sizes

router = APIRouter(prefix="/api/models", tags=["models"])

CODE = "invalid_hf_config"
#: the largest config accepted, as compact JSON (real configs are a few KiB; label maps
#: of classifiers reach a few hundred)
MAX_CONFIG_BYTES = 1024 * 1024
#: the longest `model_type` (transformers' are short identifiers: 'llama', 'gpt_neox')
MAX_MODEL_TYPE = 100
#: the keys whose text names the model a config describes, first found first
NAME_KEYS = ("_name_or_path", "name_or_path")


def _refuse(
    field: str, message: str, status: int = 422, code: str = CODE, **detail: Any
) -> ApiError:
    return ApiError(status, code, f"{field}: {message}", field=field, **detail)


def config_model_type(config: dict[str, Any]) -> str:
    """The config's `model_type`, once its size and that field are checked: 413
    `config_too_large`, or 422 `invalid_hf_config` naming `config.model_type`."""
    size = len(json.dumps(config, separators=(",", ":")))  # escaped: never under its UTF-8 size
    if size > MAX_CONFIG_BYTES:
        raise _refuse("config", f"the config is {size} bytes as JSON, more than the limit of "
                      f"{MAX_CONFIG_BYTES}", 413, "config_too_large", bytes=size,
                      limit=MAX_CONFIG_BYTES)  # fmt: skip
    if "model_type" not in config:
        raise _refuse("config.model_type", "missing: a Hugging Face config names its "
                      "architecture in `model_type` (e.g. 'llama', 'gpt2')")  # fmt: skip
    model_type = config["model_type"]
    if not isinstance(model_type, str) or not model_type.strip():
        raise _refuse("config.model_type", f"must be a non-empty string (e.g. 'llama'), not "
                      f"{json.dumps(model_type)}")  # fmt: skip
    if len(model_type) > MAX_MODEL_TYPE:
        raise _refuse("config.model_type", f"{len(model_type)} characters, more than "
                      f"{MAX_MODEL_TYPE}: no architecture is named so")  # fmt: skip
    return model_type.strip()


def default_name(config: dict[str, Any], model_type: str) -> str:
    """The base of an unnamed import's name: the config's `_name_or_path`, else its first
    `architectures` entry, else `model_type` (the worker adds ' #2', ... when taken)."""
    for key in NAME_KEYS:
        value = config.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()[:190]
    arch = config.get("architectures")
    if isinstance(arch, list) and arch and isinstance(arch[0], str) and arch[0].strip():
        return arch[0].strip()[:190]
    return model_type[:190]


@router.post(
    "/import",
    status_code=202,
    response_model=HfImportCreated,
    responses=errors(401, 409, 413, 422, 429),
)
def import_hf_config(
    body: HfImportCreate, session: SessionDep, principal: PrincipalDep, settings: SettingsDep
) -> dict[str, Any]:
    """Queue the import of a Hugging Face `config.json` (`config`, a JSON object) as a model
    built with `transformers` on the meta device, for `batch` sequences of `seq` tokens (the
    config's context length by default). 202 with the job: `GET /api/jobs/{job_id}` follows
    it; once succeeded its `result.model_id` is the new model (`source: hf_config`); an
    architecture the importer does not support, or a field it lacks, fails the job with its
    `error` naming the field, and no model is stored. Refused before anything is stored: 422
    naming `config.model_type` (missing, or not a string), `batch` or `seq` (not a positive
    int); 413 for a config over 1 MiB; 409 when the team has a model named `name`."""
    model_type = config_model_type(body.config)
    try:
        check_sizes(body.config)
    except ModelImportError as exc:
        field = str(exc.detail.get("field", "config"))
        raise _refuse(f"config.{field}", exc.message) from None
    name = body.name.strip() if body.name is not None else None
    if name == "":
        raise _refuse("name", "must not be blank")
    team = principal.team_id
    if name is not None:
        taken = select(Model.id).where(Model.team_id == team, Model.name == name)
        if session.scalar(taken) is not None:
            raise ApiError(409, "conflict", f"a model named {name!r} already exists",
                           name=name, field="name")  # fmt: skip
    base = name if name is not None else default_name(body.config, model_type)
    payload = {"config": body.config, "batch": body.batch, "seq": body.seq, "name": name,
               "base_name": base, "max_ops": settings.max_graph_ops,
               "author_id": principal.user_id}  # fmt: skip
    job = ledger.enqueue(session, settings, team, "import", payload)
    session.commit()
    return {"job_id": job.id, "status": job.status, "name": base, "model_type": model_type}
