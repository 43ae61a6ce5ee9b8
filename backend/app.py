"""The FastAPI application factory."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from backend.admission import AdmissionMiddleware, admission_slots
from backend.db import make_engine, session_factory
from backend.errors import install_error_handlers
from backend.fast_reads import FastPlanReads
from backend.idempotency import IdempotencyMiddleware
from backend.json_response import SafeJSONResponse
from backend.limits import BodyLimitMiddleware
from backend.openapi import install_openapi
from backend.rate_limit import RateLimiter
from backend.routers import (
    auth,
    baselines,
    checks,
    clusters,
    comparisons,
    jobs,
    measurements,
    model_import,
    models,
    plan_export,
    plan_graph,
    plan_schedule,
    plan_sharding,
    plan_timeline,
    plans,
    presets,
    reviews,
    searches,
    strategies,
    team_limits,
    templates,
    verifications,
    workers,
)
from backend.security import install_security
from backend.settings import Settings
from backend.strict_input import refuse_control_characters

FRONTEND_DIR = Path(__file__).resolve().parent.parent / "frontend"


def plotly_js() -> Path:
    """Plotly.js as the installed `plotly` package ships it (the UI's charts)."""
    spec = find_spec("plotly")
    assert spec is not None and spec.origin is not None, "the plotly package is a dependency"
    return Path(spec.origin).parent / "package_data" / "plotly.min.js"


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the service: REST under /api, health at /healthz, the UI at /.

    The database must be migrated already (`shardlab db upgrade`; `shardlab serve` does it).
    """
    settings = settings or Settings.from_env()
    app = FastAPI(
        title="Shardlab",
        version="0.1.0",
        openapi_url="/api/openapi.json",
        docs_url="/api/docs",
        redoc_url=None,
        default_response_class=SafeJSONResponse,  # no stored record breaks its own reads
        dependencies=[Depends(refuse_control_characters)],  # no control chars in path, query
    )
    pool = settings.api_slots + settings.fast_read_slots  # a connection for every slot
    engine = make_engine(settings.database_url, pool_size=pool)
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessions = session_factory(engine)
    app.state.write_sessions = session_factory(engine.execution_options(sqlite_immediate=True))
    app.state.rate_limiter = RateLimiter()  # requests a minute per team, in this process
    install_error_handlers(app)
    app.add_middleware(IdempotencyMiddleware)  # inside the body limit: it reads the body
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    app.add_middleware(AdmissionMiddleware, slots=admission_slots(settings, engine))
    app.add_middleware(FastPlanReads, service=app, slots=settings.fast_read_slots)
    install_security(app)  # outermost: its headers go on every answer (503s, 413s too)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    for module in (
        presets,
        auth,
        models,
        model_import,
        strategies,
        templates,
        clusters,
        plans,
        plan_graph,
        plan_sharding,
        plan_timeline,
        plan_schedule,
        plan_export,
        reviews,
        baselines,
        verifications,
        measurements,
        comparisons,
        searches,
        checks,
        jobs,
        team_limits,
        workers,
    ):
        app.include_router(module.router)

    @app.get("/vendor/plotly.min.js", include_in_schema=False)
    def plotly() -> FileResponse:
        return FileResponse(plotly_js(), media_type="text/javascript")

    install_openapi(app)
    app.mount("/", StaticFiles(directory=FRONTEND_DIR, html=True), name="frontend")
    return app
