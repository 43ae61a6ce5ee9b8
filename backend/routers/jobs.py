"""Placeholder, being written (issue 7)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
