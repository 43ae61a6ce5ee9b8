"""Model presets: the catalog a user starts from."""

from __future__ import annotations

from functools import cache
from typing import Any

from fastapi import APIRouter

from shardlab.models import PRESETS, get_preset
from shardlab.summary import model_summary

router = APIRouter(prefix="/api/presets", tags=["presets"])


@cache
def _summary(name: str) -> dict[str, Any]:
    summary = model_summary(get_preset(name).build())
    summary.pop("ops_by_kind")
    return summary


@router.get("")
def list_presets() -> list[dict[str, Any]]:
    """Every preset with its description and default config."""
    return [
        {"name": p.name, "description": p.description, "family": type(p.config).__name__}
        for p in PRESETS.values()
    ]


@router.get("/{name}")
def preset_detail(name: str) -> dict[str, Any]:
    """Parameter count, forward FLOPs, layers and config of a preset's default build."""
    return {"name": name, "description": get_preset(name).description, **_summary(name)}
