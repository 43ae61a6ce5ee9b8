"""The strategy catalog: the templates and optimization passes the engine knows.

Both lists come from the engine's registries (`shardlab.templates.TEMPLATES`,
`shardlab.passes.manager.PASSES`), so the plan form offers exactly what a strategy accepts:
a template as `name` or `name:axis`, a pass under `options.passes.<name>` (true, false or
its options).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from backend.deps import PrincipalDep
from backend.schemas.common import errors
from shardlab.passes.manager import PASSES
from shardlab.templates import TEMPLATES

router = APIRouter(prefix="/api", tags=["strategies"])


class TemplateOut(BaseModel):
    """A strategy template: it writes annotations on one mesh axis."""

    name: str = Field(description="As written in a strategy's templates, e.g. 'megatron_tp'.")
    default_axis: str = Field(
        description="The mesh axis it uses when none is given ('name:axis' picks another)."
    )
    description: str


class PassOut(BaseModel):
    """An optimization pass, in the order passes run."""

    name: str = Field(description="The key under a strategy's options.passes.")
    description: str
    default_on: bool = Field(description="Whether it runs when the strategy does not say.")
    options: dict[str, Any] = Field(description="Its options with their default values.")


@router.get("/templates", response_model=list[TemplateOut], responses=errors(401))
def list_templates(principal: PrincipalDep) -> list[dict[str, Any]]:
    """Every template the engine knows, in the engine's order."""
    return [
        {"name": t.name, "default_axis": t.default_axis, "description": t.description}
        for t in TEMPLATES.values()
    ]


@router.get("/passes", response_model=list[PassOut], responses=errors(401))
def list_passes(principal: PrincipalDep) -> list[dict[str, Any]]:
    """Every registered optimization pass, in the order they run."""
    return [
        {
            "name": p.name,
            "description": p.doc,
            "default_on": p.default_on,
            "options": dict(p.options),
        }
        for p in PASSES.values()
    ]
