"""The FastAPI app: `create_app(models, settings)` wires the models, the batchers, the guards and the routes.

Requests are checked and tokenized on the event loop; every forward pass runs on one
model thread, fed by a Batcher per model (so concurrent requests share forward passes);
shutdown (SIGTERM under uvicorn) stops accepting, answers what is queued, then returns.
"""
from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .. import __version__
from .batching import Batcher, ShuttingDown
from .errors import ApiError, install_error_handlers
from .guards import BodyLimitMiddleware, api_key_check, concurrency_limit
from .metrics import RequestMetricsMiddleware, ServerMetrics
from .models import InputTooLong, ServedModels, TextChecker
from .settings import ServeSettings

STATIC_DIR = Path(__file__).parent / "static"
CLIENT_CLOSED = 499  # nginx's code for "the client went away before the answer": counted, never delivered


@dataclass
class Server:
    """What every route shares: the models, the limits, the batchers and the model thread."""

    models: ServedModels
    settings: ServeSettings
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertforge-model"))
    batchers: dict[str, Batcher] = field(default_factory=dict)

    def checker(self, tokenizer) -> TextChecker:
        return TextChecker(tokenizer, self.settings.max_input_length)

    def texts(self, inputs: str | list[str], field_name: str = "inputs") -> list[str]:
        """A request's text or texts as a list; 400 when empty, 413 over --max-client-batch-size."""
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        if not texts:
            raise ApiError(400, "empty", f"{field_name} is an empty list; send at least one text")
        limit = self.settings.max_client_batch_size
        if len(texts) > limit:
            raise ApiError(413, "validation", f"{field_name} has {len(texts)} texts, more than the server's limit of "
                                              f"{limit} per request (--max-client-batch-size); split it into requests")
        return texts

    def encode(self, checker: TextChecker, texts: list[str], truncate: bool) -> list[list[int]]:
        try:
            return checker.encode(texts, truncate)
        except InputTooLong as error:
            raise ApiError(413, "validation", str(error)) from None

    async def run_batched(self, model: str, payloads: list, lengths: list[int], request: Request) -> list:
        """Queue the inputs on a model's batcher and wait for their results, or for the client to leave."""
        return await until_disconnected(request, self.batchers[model].submit(payloads, lengths))

    async def run_on_model_thread(self, request: Request, function, *args):
        """Run a one-off computation (explorer, search) on the model thread, after what is already there."""
        future = asyncio.get_running_loop().run_in_executor(self.executor, function, *args)
        return await until_disconnected(request, future)


async def until_disconnected(request: Request, awaitable):
    """The awaitable's result; if the client disconnects first, cancel it and answer 499.

    Cancelling the batcher's futures drops this request's inputs that are still queued, so a
    client that gave up costs no forward pass.
    """
    work = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if work in done:
        return model_result(work)
    work.cancel()
    raise ApiError(CLIENT_CLOSED, "client_closed", "the client closed the connection before the answer")


def model_result(work: asyncio.Future):
    try:
        return work.result()
    except ShuttingDown as error:
        raise ApiError(503, "unhealthy", f"{error}; retry on another replica") from None
    except ValueError as error:  # an input the model code refused (e.g. a word not in its sentence)
        raise ApiError(422, "validation", str(error)) from None
    except Exception as error:
        raise ApiError(424, "backend", f"the model failed on this input ({type(error).__name__}: {error})") from None


async def wait_for_disconnect(request: Request) -> None:
    # After the body, the server's receive() returns only when the client leaves (or the response is sent).
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(models: ServedModels, settings: ServeSettings | None = None) -> FastAPI:
    """The whole server as an ASGI app; run it with uvicorn (see `commands.serve`) or TestClient.

    Raises ValueError for settings that cannot work (see ServeSettings.checked).
    """
    from .routes import api_router
    from .explorer_routes import explorer_router

    server = Server(models, (settings or ServeSettings()).checked(models.embedding.max_length))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        for name, model in (("embed", models.embedding), ("fill-mask", models.masked_lm),
                            ("classify", models.classifier)):
            if model is not None:
                server.batchers[name] = Batcher(name, model.run_batch, server.executor,
                                                max_batch_tokens=server.settings.max_batch_tokens,
                                                max_batch_requests=server.settings.max_batch_requests,
                                                metrics=server.metrics)
                server.batchers[name].start()
        yield
        for batcher in server.batchers.values():  # uvicorn has stopped accepting: answer what is queued
            await batcher.close()
        server.executor.shutdown(wait=True)

    app = FastAPIOffline(title="bertforge", version=__version__, lifespan=lifespan,
                         description="BERT over HTTP: embeddings (text-embeddings-inference and OpenAI shapes), "
                                     "tokenize, fill-mask, classify, search, and the explorer page at /.")
    app.state.server = server
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=server.settings.max_request_bytes,
                       timeout=server.settings.body_timeout_seconds)
    app.add_middleware(RequestMetricsMiddleware, metrics=server.metrics)

    authorized = Depends(api_key_check(server.settings.api_key))
    admitted = Depends(concurrency_limit(server.settings.max_concurrent_requests, server.metrics))
    app.include_router(api_router(server), dependencies=[authorized, admitted])
    app.include_router(explorer_router(server, admitted), dependencies=[authorized])

    @app.get("/health", tags=["server"], summary="200 while the server can answer")
    async def health():
        if any(b.loop_task is None or b.loop_task.done() for b in server.batchers.values()):
            raise ApiError(503, "unhealthy", "a model's batch loop has stopped; restart the server")
        return {"status": "ok"}

    @app.get("/metrics", tags=["server"], summary="Prometheus metrics", dependencies=[authorized])
    async def metrics():
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app
