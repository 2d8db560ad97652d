"""The FastAPI app: `create_app(models, settings)` wires the models, the batchers, the guards and the routes.

Requests are checked on the event loop and tokenized on one tokenizer thread; every forward
pass runs on one model thread, fed by a Batcher per kind of pass (so concurrent requests share
forward passes);
shutdown (SIGTERM under uvicorn) stops accepting, answers what is queued, then returns.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .. import __version__
from . import embed_routes, explorer_routes, routes
from .errors import ApiError, install_error_handlers
from .fast_lane import FastLane, lanes_for
from .guards import BodyLimitMiddleware, ConcurrencyLimitMiddleware, api_key_check
from .metrics import RequestMetricsMiddleware
from .models import ServedModels
from .server import Server
from .settings import ServeSettings

STATIC_DIR = Path(__file__).parent / "static"
FAST_LANE_PATHS = ("/embed", "/", "/v1/embeddings", "/embeddings")  # the routes one-text clients call most


def create_app(models: ServedModels, settings: ServeSettings | None = None) -> FastAPI:
    """The whole server as an ASGI app; run it with uvicorn (see `commands.serve`) or TestClient.

    Raises ValueError for settings that cannot work (see ServeSettings.checked).
    """
    heads = (models.masked_lm, models.classifier, models.reranker)
    settings = (settings or ServeSettings()).checked(models.embedding.max_length,
                                                     [model.max_length for model in heads if model is not None])
    server = Server(models, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        server.start()
        yield
        await server.stop()

    app = FastAPIOffline(title="bertforge", version=__version__, lifespan=lifespan,
                         description="BERT over HTTP: embeddings (text-embeddings-inference and OpenAI shapes), "
                                     "tokenize, fill-mask, classify, search, and the explorer page at /.")
    app.state.server = server
    install_error_handlers(app)
    model_routers = (embed_routes.router, routes.router, explorer_routes.router)
    # The last added runs first: metrics see every request, 429s included; then the concurrency limit; then the body;
    # then the embedding routes' fast lane.
    app.add_middleware(FastLane, server=server, lanes=lanes_for(embed_routes.router.routes, FAST_LANE_PATHS),
                       api_key=server.settings.api_key.encode() if server.settings.api_key else None)
    app.add_middleware(BodyLimitMiddleware, max_bytes=server.settings.payload_limit,
                       timeout=server.settings.body_timeout_seconds)
    app.add_middleware(ConcurrencyLimitMiddleware, limit=server.settings.max_concurrent_requests, metrics=server.metrics,
                       limited={(method, route.path) for router in model_routers for route in router.routes
                                for method in getattr(route, "methods", ())})
    app.add_middleware(RequestMetricsMiddleware, metrics=server.metrics)

    # Without --api-key there is nothing to check: no dependency at all (each one costs the event loop per request).
    authorized = [Depends(api_key_check(server.settings.api_key))] if server.settings.api_key else []
    for router in model_routers:
        app.include_router(router, dependencies=authorized)
    app.include_router(explorer_routes.info_router, dependencies=authorized)

    @app.get("/health", tags=["server"], summary="200 while the server can answer")
    @app.get("/ping", include_in_schema=False)  # SageMaker's health check, which TEI answers too
    async def health():
        if any(b.loop_task is None or b.loop_task.done() for b in server.batchers.values()):
            raise ApiError(503, "unhealthy", "a model's batch loop has stopped; restart the server")
        return {"status": "ok"}

    # Without the API key, as TEI serves it: a Prometheus scrape configured for TEI carries none (counts and
    # latencies, no request's text)
    @app.get("/metrics", tags=["server"], summary="Prometheus metrics")
    async def metrics():
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app
