"""Models: serial graphs from a preset (with overrides) or from graph JSON, per team.

The graph is stored compressed (`blobs.pack`) with its summary; nothing is written until the
graph is built, validated against the op catalog and summarized.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, defer

from backend.auth import Principal
from backend.blobs import pack, unpack
from backend.deps import PrincipalDep, SessionDep, SettingsDep
from backend.errors import ApiError, not_found, user_input
from backend.json_response import SafeJSONResponse
from backend.module_tree import module_tree
from backend.orm import Model, Plan
from backend.ownership import require_removal
from backend.pagination import Page, PageWindow, pages
from backend.schemas.common import PathId
from backend.schemas.resources import ModelCreate, ModelDetail, ModelOut, ModuleNode
from shardlab.errors import GraphError, PresetError
from shardlab.graph_json import graph_from_json, graph_to_json
from shardlab.ir import Graph
from shardlab.models import Preset, get_preset
from shardlab.models.config import ModelConfig, TransformerConfig, apply_overrides
from shardlab.summary import model_summary
from shardlab.user_json import too_deep
from shardlab.validate import validate_graph

router = APIRouter(prefix="/api/models", tags=["models"])

UPLOAD_TYPES = ("application/json", "application/octet-stream")
#: a graph document's ops per page (`GET /api/models/{id}/graph`)
OpPage = Annotated[PageWindow, Depends(pages(10_000, 100_000, "Ops"))]


# -- helpers shared by the resource routers -------------------------------------------------


def commit_or_conflict(session: Session, message: str, **detail: Any) -> None:
    """Commit; a unique-constraint violation (a concurrent create) becomes 409 `conflict`."""
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise ApiError(409, "conflict", message, **detail) from None


def flush_or_conflict(session: Session, message: str, **detail: Any) -> None:
    """Flush what was added (the caller commits it later with everything else); a
    unique-constraint violation (a concurrent create) rolls back and becomes 409 `conflict`."""
    try:
        session.flush()
    except IntegrityError:
        session.rollback()
        raise ApiError(409, "conflict", message, **detail) from None


# -- building and checking graphs -----------------------------------------------------------


def _too_large(ops: int, limit: int, about: str = "") -> ApiError:
    return ApiError(
        413,
        "graph_too_large",
        f"the graph has {about}{ops} ops, more than the limit of {limit} (SHARDLAB_MAX_GRAPH_OPS)",
        ops=ops,
        limit=limit,
    )


def _preset_config(preset: str, overrides: dict[str, Any]) -> tuple[Preset, ModelConfig]:
    """The preset and its config with `overrides` applied; an unknown preset is the engine's
    404 naming it, a bad override 422 naming the key."""
    base = get_preset(preset)
    try:
        with user_input("invalid_override", f"overrides of preset {preset!r}", preset=preset):
            return base, apply_overrides(base.config, overrides, preset)
    except PresetError as exc:
        raise ApiError(422, "invalid_override", exc.message, preset=preset, **exc.detail) from None


def _preset_graph(preset: str, overrides: dict[str, Any], limit: int) -> Graph:
    """Build a preset; bad overrides are 422 naming the key (or the value whose shape they
    make too large, `shardlab.ir.MAX_ELEMENTS`); oversized layer counts are refused (413)
    from an estimate before the full graph is built."""
    base, config = _preset_config(preset, overrides)
    try:
        if isinstance(config, TransformerConfig) and config.layers > 2:
            one, two = (len(base.build({**overrides, "layers": n}).ops) for n in (1, 2))
            estimate = one + (config.layers - 1) * (two - one)
            if estimate > limit:
                raise _too_large(estimate, limit, "about ")
        graph = base.build(overrides)
    except PresetError as exc:
        raise ApiError(422, "invalid_override", exc.message, preset=preset, **exc.detail) from None
    except GraphError as exc:
        message = f"overrides of preset {preset!r}: {exc.message}"
        raise ApiError(422, "invalid_override", message, preset=preset, **exc.detail) from None
    if len(graph.ops) > limit:
        raise _too_large(len(graph.ops), limit)
    return graph


def _document_graph(data: Any, limit: int) -> Graph:
    """Parse and validate a graph document; the op count is checked before parsing, and a
    graph without ops is no model (422 naming `graph`)."""
    ops = data.get("ops") if isinstance(data, dict) else None
    if isinstance(ops, list) and len(ops) > limit:
        raise _too_large(len(ops), limit)
    with user_input("invalid_graph", "invalid graph JSON"):
        graph = validate_graph(graph_from_json(data))
    if not graph.ops:
        raise ApiError(422, "invalid_graph", f"graph {graph.name!r} has no ops; a model needs "
                       "at least one", field="graph")  # fmt: skip
    return graph


def _summary(graph: Graph) -> dict[str, Any]:
    with user_input("invalid_graph", f"graph {graph.name!r} cannot be summarized"):
        summary = model_summary(graph)
    if not isinstance(summary["config"], dict):  # a user's graph meta may hold anything
        summary["config"] = {}
    return summary


@dataclass(frozen=True)
class BuiltModel:
    """A model built in memory, packed and summarized before any statement (seconds for a
    150,000-op graph), so that no transaction, and on SQLite no write lock, is held
    meanwhile: what `add_model` stores (`fields`: its preset and overrides)."""

    graph: Graph
    blob: bytes
    summary: dict[str, Any]
    source: str
    fields: dict[str, Any] = field(default_factory=dict)


def packed(graph: Graph) -> bytes:
    """The stored form of a graph: its graph JSON, compressed."""
    blob, _ = pack(graph_to_json(graph))
    return blob


def built_model(graph: Graph, source: str, blob: bytes | None = None, **fields: Any) -> BuiltModel:
    """`graph` packed (unless its `blob` is given) and summarized, ready to store."""
    return BuiltModel(graph, packed(graph) if blob is None else blob, _summary(graph), source,
                      fields)  # fmt: skip


def add_model(
    session: Session, team_id: int, name: str, model: BuiltModel, author_id: int | None = None
) -> Model:
    """Add the built model (made by `author_id`; None: a team token) and flush it, without
    committing: the caller commits it with whatever else it adds. A name taken in the team
    is 409 `conflict`."""
    taken = select(Model.id).where(Model.team_id == team_id, Model.name == name)
    if session.scalar(taken) is not None:
        raise ApiError(409, "conflict", f"a model named {name!r} already exists", name=name)
    row = Model(team_id=team_id, name=name, source=model.source, graph_blob=model.blob,
                summary=model.summary, author_id=author_id, **model.fields)  # fmt: skip
    session.add(row)
    flush_or_conflict(session, f"a model named {name!r} already exists", name=name)
    return row


def _store(session: Session, principal: Principal, name: str, model: BuiltModel) -> Model:
    """Insert the model the caller made (one commit, after everything above succeeded)."""
    row = add_model(session, principal.team_id, name, model, principal.user_id)
    commit_or_conflict(session, f"a model named {name!r} already exists", name=name)
    return row


# -- finding or adding the model a check names ---------------------------------------------
#
# A check resolves its model before its write transaction (`find_*`, `new_*`: the graph built
# and packed in memory), then finds it again or adds it in that transaction (`add_new_model`).


def find_preset_model(
    session: Session, team_id: int, preset: str, overrides: dict[str, Any]
) -> Model | None:
    """The team's model of `preset` with `overrides` (equal configs: `{"layers": "4"}` is
    `{"layers": 4}`; its graph blob deferred), or None. An unknown preset is the engine's
    404, a bad override 422 naming the key."""
    _, config = _preset_config(preset, overrides)
    query = (
        select(Model)
        .where(Model.team_id == team_id, Model.source == "preset", Model.preset == preset)
        .options(defer(Model.graph_blob))
        .order_by(Model.id)
    )
    return next(
        (row for row in session.scalars(query) if _config_of(preset, row.overrides) == config),
        None,
    )


def new_preset_model(preset: str, overrides: dict[str, Any], limit: int) -> tuple[str, BuiltModel]:
    """The model of `preset` with `overrides`, built in memory (nothing stored), and the name
    it is stored under unless the team has that name already, e.g. `llama3-8b (layers=4)`."""
    _, config = _preset_config(preset, overrides)
    graph = _preset_graph(preset, overrides, limit)
    shown = ", ".join(f"{key}={getattr(config, key)}" for key in overrides)
    model = built_model(graph, "preset", preset=preset, overrides=overrides)
    return f"{preset} ({shown})" if shown else preset, model


def document_blob(data: Any, limit: int) -> tuple[Graph, bytes]:
    """The graph document `data` parsed, validated and packed (nothing stored)."""
    graph = _document_graph(data, limit)
    return graph, packed(graph)


def find_document_model(session: Session, team_id: int, blob: bytes) -> Model | None:
    """The team's first model whose stored graph is byte-identical to `blob`, or None."""
    same = select(Model).where(Model.team_id == team_id, Model.graph_blob == blob)
    return session.scalars(same.options(defer(Model.graph_blob)).order_by(Model.id)).first()


def new_document_model(graph: Graph, blob: bytes) -> tuple[str, BuiltModel]:
    """The model of a parsed graph document (summarized, nothing stored) and the name it is
    stored under unless the team has that name already: the graph's."""
    return graph.name.strip() or "graph", built_model(graph, "json", blob=blob)


def add_new_model(
    session: Session, team_id: int, base: str, model: BuiltModel, author_id: int | None = None
) -> Model:
    """Add the built model (flushed, not committed) as `base`, or `base #2`, ... if taken."""
    name = free_model_name(session, team_id, base)
    return add_model(session, team_id, name, model, author_id)


def free_model_name(session: Session, team_id: int, base: str) -> str:
    """`base` (cut to fit the name column), or `base #2`, `#3`, ... if the team has it."""
    base = base[:190]
    names = select(Model.name).where(Model.team_id == team_id, Model.name.startswith(base))
    taken = set(session.scalars(names))
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base} #{n}"
    return name


def _config_of(preset: str, overrides: dict[str, Any]) -> ModelConfig | None:
    """The config a stored model's overrides give now; None if they no longer apply."""
    try:
        return apply_overrides(get_preset(preset).config, overrides, preset)
    except (PresetError, ValueError, KeyError, TypeError):
        return None


# -- reading --------------------------------------------------------------------------------


def owned_model(session: Session, team_id: int, model_id: int) -> Model:
    """The team's model `model_id`; 404 for a missing one or another team's."""
    row = session.get(Model, model_id)
    if row is None or row.team_id != team_id:
        raise not_found("model", model_id)
    return row


def _out(row: Model) -> dict[str, Any]:
    s = row.summary
    return {
        "id": row.id,
        "name": row.name,
        "source": row.source,
        "preset": row.preset,
        "overrides": row.overrides,
        "params": s.get("params", 0),
        "flops_forward": s.get("flops_forward", 0),
        "layers": s.get("layers", 0),
        "ops": s.get("ops", 0),
        "created_at": row.created_at,
    }


def _detail(row: Model) -> dict[str, Any]:
    return {**_out(row), "summary": row.summary}


async def _raw_graph_body(request: Request, settings: SettingsDep) -> bytes:
    """The request body of an upload: a JSON content type, at most max_request_bytes."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind and kind not in UPLOAD_TYPES:
        raise ApiError(
            415,
            "unsupported_media_type",
            f"upload the graph JSON as the raw body with Content-Type "
            f"{' or '.join(UPLOAD_TYPES)}, not {kind!r}",
            content_type=kind,
        )
    return await _read_limited(request.stream(), settings.max_request_bytes)


async def _read_limited(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    data = bytearray()
    async for chunk in chunks:
        data += chunk
        if len(data) > limit:
            raise ApiError(
                413,
                "request_too_large",
                f"the request body exceeds {limit} bytes (SHARDLAB_MAX_REQUEST_BYTES)",
                limit=limit,
            )
    return bytes(data)


def _parse_upload(body: bytes) -> Any:
    """JSON from raw bytes; errors name the line and column."""
    try:
        return json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise GraphError(f"the upload is not UTF-8 text: {exc}", position=exc.start) from None
    except json.JSONDecodeError as exc:
        raise GraphError(
            f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
            line=exc.lineno,
            column=exc.colno,
        ) from None
    except RecursionError:
        raise GraphError(f"the upload's JSON is {too_deep().message}") from None


# -- endpoints ------------------------------------------------------------------------------


@router.post("", status_code=201, response_model=ModelDetail)
def create_model(
    body: ModelCreate, session: SessionDep, principal: PrincipalDep, settings: SettingsDep
) -> dict[str, Any]:
    """Create a model from `{name, preset, overrides}` or `{name, graph}`: built, packed and
    summarized before the first statement (on SQLite, before the write lock)."""
    limit = settings.max_graph_ops
    if body.preset is not None:
        graph = _preset_graph(body.preset, body.overrides, limit)
        model = built_model(graph, "preset", preset=body.preset, overrides=body.overrides)
    else:
        model = built_model(_document_graph(body.graph, limit), "json")
    return _detail(_store(session, principal, body.name, model))


UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "description": "A graph JSON file (shardlab.graph/1) as the raw body.",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


@router.post("/upload", status_code=201, response_model=ModelDetail, openapi_extra=UPLOAD_BODY)
def upload_model(
    name: Annotated[str, Query(min_length=1, max_length=200, description="The model's name.")],
    body: Annotated[bytes, Depends(_raw_graph_body)],
    session: SessionDep,
    principal: PrincipalDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    """Create a model from a graph JSON file sent as the raw request body (packed and
    summarized before the first statement, as `create_model`)."""
    graph = _document_graph(_parse_upload(body), settings.max_graph_ops)
    return _detail(_store(session, principal, name, built_model(graph, "upload")))


@router.get("", response_model=list[ModelOut])
def list_models(session: SessionDep, principal: PrincipalDep, page: Page) -> list[dict[str, Any]]:
    """The team's models, oldest first, a page at a time (`pagination`)."""
    query = (
        select(Model)
        .where(Model.team_id == principal.team_id)
        .options(defer(Model.graph_blob))
        .order_by(Model.id)
    )
    return [_out(row) for row in page.rows(session, query)]


@router.get("/{model_id}", response_model=ModelDetail)
def get_model(model_id: PathId, session: SessionDep, principal: PrincipalDep) -> dict[str, Any]:
    """A model with its summary (params, FLOPs, layers, ops, ...), source and overrides."""
    return _detail(owned_model(session, principal.team_id, model_id))


@router.get("/{model_id}/graph")
def get_graph(
    model_id: PathId,
    session: SessionDep,
    principal: PrincipalDep,
    page: OpPage,
    scope: Annotated[
        str, Query(max_length=500, description='Only ops under this scope ("layers.3").')
    ] = "",
) -> SafeJSONResponse:
    """The model's graph document (`shardlab.graph/1`), a page of ops at a time (`limit`,
    10,000 ops unless asked; `X-Total-Count` counts the ops, `Link` names the next page):
    each page holds its ops and the values they read or write, so a client walks a
    200,000-op model without one 37 MB answer. `scope` keeps the ops under a module path."""
    document = unpack(owned_model(session, principal.team_id, model_id).graph_blob)
    return SafeJSONResponse(graph_page(document, scope, page), headers=page.headers())


def graph_page(document: dict[str, Any], scope: str, page: PageWindow) -> dict[str, Any]:
    """The document with only the page's ops (under `scope`) and the values they touch; the
    document as it is when one page holds all of it."""
    ops = document.get("ops", [])
    if scope:
        ops = [op for op in ops if op.get("scope") == scope or
               str(op.get("scope", "")).startswith(scope + ".")]  # fmt: skip
    page.count(len(ops))
    if not scope and page.offset == 0 and len(ops) <= page.limit:
        return document
    ops = ops[page.offset : page.offset + page.limit]
    touched = {name for op in ops for name in (*op.get("inputs", []), *op.get("outputs", []))}
    values = [v for v in document.get("values", []) if v.get("name") in touched]
    outputs = [name for name in document.get("outputs", []) if name in touched]
    return {**document, "values": values, "ops": ops, "outputs": outputs}


#: module trees of models (immutable once stored), by model id: the tree of a 200,000-op
#: model takes seconds to build from its document
TREES: dict[int, dict[str, Any]] = {}
TREES_KEPT = 64


@router.get("/{model_id}/tree", response_model=ModuleNode)
def get_tree(model_id: PathId, session: SessionDep, principal: PrincipalDep) -> dict[str, Any]:
    """The folded module tree of the model's graph (see backend.module_tree)."""
    row = owned_model(session, principal.team_id, model_id)
    tree = TREES.get(row.id)
    if tree is None:
        tree = module_tree(graph_from_json(unpack(row.graph_blob)))
        if len(TREES) >= TREES_KEPT:
            TREES.pop(next(iter(TREES)))
        TREES[row.id] = tree
    return tree


@router.delete("/{model_id}", status_code=204)
def delete_model(model_id: PathId, session: SessionDep, principal: PrincipalDep) -> Response:
    """Delete a model; only its author or an admin may (403), and not while a plan
    references it (409)."""
    row = owned_model(session, principal.team_id, model_id)
    require_removal(principal, row.author_id, f"model {row.id}")
    plans = session.scalar(select(func.count()).where(Plan.model_id == row.id)) or 0
    if plans:
        raise ApiError(
            409,
            "conflict",
            f"model {row.name!r} is used by {plans} plan(s); delete those plans first",
            model_id=row.id,
            plans=plans,
        )
    session.delete(row)
    session.commit()
    return Response(status_code=204)
