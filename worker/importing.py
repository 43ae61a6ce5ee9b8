"""The `import` job: a Hugging Face config built on the meta device and stored as a model.

`POST /api/models/import` (`backend/routers/model_import.py`) checks the config cheaply and
queues the job with the payload `{"config", "batch", "seq", "name", "base_name", "max_ops"}`.
Here:

- `import_inputs` hands the payload to the engine (no row to load: the config is the input);
- `run_import` runs in the job's child process: it needs torch and transformers (a worker
  without them fails the job `importer_unavailable`, saying what to install), builds the
  graph with `shardlab.importers.hf_config.graph_from_hf_config` (a config it refuses fails
  the job with its `import_error` naming the field), bounds its ops by `max_ops` (the API's
  `SHARDLAB_MAX_GRAPH_OPS`), validates it and returns it as graph JSON;
- `import_outcome`, in the worker, packs and summarizes the graph before the transaction
  (`backend.routers.models.built_model`) and stores it in `ledger.finish`'s transaction
  through `add_model`, as `POST /api/models` does: under the asked name (a name taken
  meanwhile fails the job `conflict`), or the base name made unique (`free_model_name`). The
  job's result names the model (`model_id`, `name`, `params`, `ops`). Whatever fails, no
  model row is written.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shardlab.errors import ShardlabError
from shardlab.graph_json import graph_from_json, graph_to_json
from shardlab.validate import validate_graph

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from backend.ledger import Store
    from backend.orm import Job

Progress = Callable[[float, str], None]

#: the stored models' `source` of an import
SOURCE = "hf_config"
#: the engine module that builds a graph from a Hugging Face config
IMPORTER = "shardlab.importers.hf_config"
#: what the importer needs installed (the `shardlab[import]` extra)
REQUIRED = ("torch", "transformers")


class ImporterUnavailable(ShardlabError):
    """This worker cannot import Hugging Face configs: torch, transformers or the importer
    module is not installed."""

    code = "importer_unavailable"


class ImportRefused(ShardlabError):
    """The imported graph is refused (too many ops, none) or cannot be stored (its name was
    taken meanwhile, it cannot be summarized): carries the refusal's own code."""

    def __init__(self, code: str, message: str, **detail: Any) -> None:
        super().__init__(message, **detail)
        self.code = code


def import_inputs(job: Job) -> dict[str, Any]:
    """The engine inputs of an `import` job: its payload's config and sizes."""
    payload = job.payload
    return {key: payload.get(key) for key in ("config", "batch", "seq", "base_name", "max_ops")}


def _importer() -> Callable[..., Any]:
    """`graph_from_hf_config`, or ImporterUnavailable saying what this worker lacks."""
    missing = [name for name in REQUIRED if importlib.util.find_spec(name) is None]
    if missing:
        raise ImporterUnavailable(
            f"this worker cannot import Hugging Face configs: {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed (install the "
            "'shardlab[import]' extra on the worker)",
            missing=missing,
        )
    try:
        module = importlib.import_module(IMPORTER)
    except ModuleNotFoundError as exc:
        if exc.name is None or not IMPORTER.startswith(exc.name):
            raise  # something the importer itself imports is missing: an engine bug
        raise ImporterUnavailable(
            f"this worker's shardlab has no Hugging Face importer ({IMPORTER}); update it",
            module=IMPORTER,
        ) from None
    build: Callable[..., Any] = module.graph_from_hf_config
    return build


def run_import(inputs: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Build the config's model on the meta device: `{"graph": graph JSON}`, validated and
    within `max_ops` ops."""
    config = inputs["config"]
    model_type = config.get("model_type", "?") if isinstance(config, dict) else "?"
    progress(0.05, "loading torch and transformers")
    build = _importer()
    progress(0.2, f"building the {model_type} model with transformers on the meta device")
    seq = inputs.get("seq")
    graph = build(config, batch=int(inputs.get("batch") or 1),
                  seq=None if seq is None else int(seq), name=inputs.get("base_name"))  # fmt: skip
    limit = int(inputs.get("max_ops") or 0)
    if limit and len(graph.ops) > limit:
        raise ImportRefused(
            "graph_too_large",
            f"the imported graph has {len(graph.ops)} ops, more than the limit of {limit} "
            "(SHARDLAB_MAX_GRAPH_OPS); import fewer layers (num_hidden_layers)",
            ops=len(graph.ops),
            limit=limit,
        )
    progress(0.8, f"validating {len(graph.ops)} ops")
    validate_graph(graph)
    if not graph.ops:
        raise ImportRefused("invalid_graph", f"the imported graph {graph.name!r} has no ops")
    return {"graph": graph_to_json(graph)}


def import_outcome(job: Job, data: dict[str, Any]) -> tuple[Store, dict[str, Any]]:
    """How to store the imported model, and the job's result (`model_id` and `name` are
    filled in by the store, which runs in `ledger.finish` before the result is written).
    The graph is packed and summarized here, before the transaction; a refusal becomes a
    store that fails the job with it (nothing stored)."""
    from backend.errors import ApiError
    from backend.routers.models import add_model, built_model, free_model_name

    payload = job.payload
    options = {"batch": payload.get("batch", 1)}
    if payload.get("seq") is not None:
        options["seq"] = payload["seq"]
    try:
        model = built_model(graph_from_json(data["graph"]), SOURCE, overrides=options)
    except (ApiError, ShardlabError) as exc:
        refusal = ImportRefused(exc.code, exc.message, **exc.detail)

        def refuse(session: Session, job: Job) -> None:
            raise refusal

        return refuse, {}

    result: dict[str, Any] = {"model_id": None, "name": None, "model_type":
                              payload["config"].get("model_type"),
                              "params": model.summary.get("params"),
                              "ops": model.summary.get("ops")}  # fmt: skip

    def store_model(session: Session, job: Job) -> None:
        name = payload.get("name")
        if name is None:
            name = free_model_name(session, job.team_id, str(payload.get("base_name") or SOURCE))
        try:
            row = add_model(session, job.team_id, name, model, payload.get("author_id"))
        except ApiError as exc:  # the name was taken since the job was queued
            raise ImportRefused(exc.code, exc.message, **exc.detail) from None
        result["model_id"], result["name"] = row.id, row.name

    return store_model, result
