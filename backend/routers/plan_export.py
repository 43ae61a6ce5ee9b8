"""A built plan exported for PyTorch: `GET /api/plans/{id}/export?format=...` as a download.

Formats (`shardlab.export.plan_export`): `dtensor` (a Python module with
`parallelize(model, world_mesh=None)`), `torchtitan` (torchtitan 0.3's command-line
options), `torchtitan-toml` (the `[parallelism]` and `[activation_checkpoint]` TOML of
torchtitan before 0.3), `megatron` (Megatron-LM's `pretrain_gpt.py` options) and `json`
(every parameter's placements). The answer is
the file as an attachment (`Content-Disposition`, named `plan<id>_...`); notes on what the
export cannot say exactly travel in the `X-Export-Notes` header (JSON list). The plan is
rebuilt from its stored `plan` artifact (model, strategy, optimizer; completion only, about
half a second for Llama 3 8B). An unknown format and a plan the export refuses (a partial
parameter, two tensor-parallel axes) answer 422 `export_error` naming the format, value or
axis; a plan not built yet 409; another team's or a missing plan 404.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from backend.deps import PrincipalDep, SessionDep
from backend.routers.plans import artifact, built_plan
from backend.schemas.common import PathId, errors
from shardlab.export.plan_export import EXPORTS, export_format, export_plan, rebuild_plan

router = APIRouter(prefix="/api/plans", tags=["plans"])

FormatQuery = Annotated[
    str,
    Query(max_length=32, description=f"The export format: {', '.join(EXPORTS)}."),
]


#: The 200 answer's documented content: one media type per format, the file as text.
FILE_ANSWER: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The exported file, as an attachment.",
        "content": {f.media_type: {"schema": {"type": "string"}} for f in EXPORTS.values()},
    }
}


@router.get(
    "/{plan_id}/export",
    response_class=Response,
    responses={**FILE_ANSWER, **errors(401, 404, 409, 422)},
)
def export_plan_file(
    plan_id: PathId, session: SessionDep, principal: PrincipalDep, format: FormatQuery = "dtensor"
) -> Response:
    """The plan as a DTensor module, torchtitan or Megatron-LM options or placements
    JSON, as an attachment (module docstring)."""
    export_format(format)  # an unknown format is refused before anything is read
    plan = built_plan(session, principal.team_id, plan_id)
    data = artifact(session, plan, "plan")
    exported = export_plan(rebuild_plan(data), format, stem=f"plan{plan_id}")
    headers = {
        "Content-Disposition": f'attachment; filename="{exported.filename}"',
        "X-Export-Notes": json.dumps(list(exported.notes), ensure_ascii=True),
    }
    return Response(exported.text, media_type=exported.media_type, headers=headers)
