"""`Server`: what every route shares (models, settings, batchers, the tokenizer and model threads).

Routes get it with `Depends(current_server)`; `create_app` puts it on `app.state`.
Tokenizing runs on one tokenizer thread and every forward pass on one model thread, so the
event loop only parses requests and writes answers, and a 2,048-text request does not stall
the requests behind it while it is tokenized.
"""
from __future__ import annotations

import asyncio
import gc
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import torch
from fastapi import Request

from ..engine.governor import ThreadGovernor
from ..engine.threads import chosen_while_running, default_threads
from ..models.folder import check_prompt_pooled, default_prompt
from .batching import Batcher, ShuttingDown
from .errors import ApiError
from .inputs import InputEncoder, Prompts
from .metrics import ServerMetrics
from .models import ServedModels
from .settings import ServeSettings

CLIENT_CLOSED = 499  # nginx's code for "the client went away before the answer": counted, never delivered
GPU_SWITCH_INTERVAL = 0.0005  # seconds a thread holds the interpreter lock when another wants it (Python's: 0.005)


def single_thread(name: str) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)


@dataclass
class Server:
    """The models, the checked settings, one batcher per kind of forward pass, and the two threads."""

    models: ServedModels
    settings: ServeSettings
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    executor: ThreadPoolExecutor = field(default_factory=lambda: single_thread("bertforge-model"))
    tokenizing: ThreadPoolExecutor = field(default_factory=lambda: single_thread("bertforge-tokenize"))
    batchers: dict[str, Batcher] = field(default_factory=dict)
    encoders: dict[str, InputEncoder] = field(default_factory=dict)
    threads: int = 0  # CPU threads for the models: --threads, else OMP_NUM_THREADS, else the usable physical cores
    # Without --threads or OMP_NUM_THREADS, on the CPU: the count, up to `threads`, chosen batch by batch
    # (engine/governor.py), as the Embedder chooses it; one for every batcher, all on the one model thread.
    governor: ThreadGovernor | None = None
    switch_interval: float | None = None  # the interpreter's, to give back at stop when start changed it

    def __post_init__(self):
        models, settings = self.models, self.settings
        self.threads = settings.threads or default_threads()
        if chosen_while_running(settings.threads) and models.embedding.embedder.device.type == "cpu":
            self.governor = ThreadGovernor(self.threads)  # on a GPU the CPU's thread count is not what a batch waits on
        default = self.default_prompt()
        check_prompt_pooled(models.embedding.folder, default, "--default-prompt")  # a user's text or name
        prompts = Prompts(models.prompts, default, models.embedding.name, models.embedding.folder)
        # One Prompts for the routes that embed text (/embed*, /embed_sparse on the MLM), as TEI applies them.
        for name, model, prompted in (("embed", models.embedding, True), ("sparse", models.masked_lm, True),
                                      ("mlm", models.masked_lm, False), ("classify", models.classifier, False),
                                      ("rerank", models.reranker, False)):
            if model is not None:  # each model's inputs within its own limit (a classifier's as it was trained)
                limit = settings.input_limit(model.max_length)
                self.encoders[name] = InputEncoder(model.tokenizer, limit, settings.auto_truncate,
                                                   prompts if prompted else Prompts())

    def default_prompt(self) -> str:
        """--default-prompt; else --default-prompt-name, which must be one of the folder's prompts; else the
        folder's own default_prompt_name, read as sentence-transformers reads it (models.folder.default_prompt:
        a name that is not among its prompts means no prompt)."""
        settings, models = self.settings, self.models
        if settings.default_prompt is not None:
            return settings.default_prompt
        name = settings.default_prompt_name
        if name is None:
            return default_prompt(models.prompts, models.default_prompt_name)
        if name not in models.prompts:
            known = ", ".join(models.prompts) or "none"
            raise ValueError(f"--default-prompt-name {name}: the model's prompts are {known}; give one of them, "
                             "or the text itself with --default-prompt")
        return models.prompts[name]

    def start(self) -> None:
        """torch's thread count, and a batcher (queue + loop) per kind of forward pass; call on the event loop."""
        torch.set_num_threads(self.threads)  # the governor, when there is one, sets each batch's own
        if self.models.embedding.embedder.device.type == "cuda":
            # A pass on the GPU is milliseconds of Python around waits for the device (the inputs' copy, the
            # results' copy back); at each wait the model thread lets go of the interpreter lock, and the event
            # loop's thread, busy with the clients, kept it for up to the default 5 ms switch interval each time.
            self.switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(GPU_SWITCH_INTERVAL)
        # What exists now (the models, the tokenizers, the app) lives as long as the server: out of the collector's
        # sight, its full collections no longer walk it. With 16 one-text clients the event loop spent 0.32 ms a
        # request without this, 0.22 with it (and the fast lane, fast_lane.py), part of it in those walks.
        gc.collect()
        gc.freeze()
        for name, run_batch in self.forward_passes().items():
            self.batchers[name] = Batcher(name, run_batch, self.executor,
                                          max_batch_tokens=self.settings.max_batch_tokens,
                                          max_batch_requests=self.settings.max_batch_requests, metrics=self.metrics,
                                          governor=self.governor)
            self.batchers[name].start()

    def forward_passes(self) -> dict[str, Callable[[list], list]]:
        """Each batcher's name and what it runs on the model thread: payloads -> one result each."""
        models = self.models
        passes = {"embed": models.embedding.pooled, "embed_all": models.embedding.token_states}
        if models.masked_lm is not None:
            passes["sparse"] = models.masked_lm.sparse
            passes["fill-mask"] = lambda payloads: models.masked_lm.fill([t for t, _ in payloads],
                                                                         [k for _, k in payloads])
        if models.classifier is not None:
            passes["classify"] = models.classifier.logits
        if models.reranker is not None:
            passes["rerank"] = models.reranker.logits
        return passes

    async def stop(self) -> None:
        for batcher in self.batchers.values():  # uvicorn has stopped accepting: answer what is queued
            await batcher.close()
        self.executor.shutdown(wait=True)
        if self.switch_interval is not None:
            sys.setswitchinterval(self.switch_interval)
        self.tokenizing.shutdown(wait=True)
        gc.unfreeze()  # a server stopped inside a longer process (tests, a notebook) leaves it collectable again

    async def tokenized(self, function: Callable, *args):
        """function(*args) on the tokenizer thread (InputEncoder methods, tokenizer calls)."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenizing, function, *args)

    async def run_batched(self, name: str, payloads: list, lengths: list[int], request: Request) -> list:
        """Queue the inputs on a batcher and wait for their results, or for the client to leave."""
        return await until_disconnected(request, self.batchers[name].submit(payloads, lengths))

    async def run_on_model_thread(self, request: Request, function: Callable, *args):
        """Run a one-off computation (explorer, search) on the model thread, after what is already there."""
        future = asyncio.get_running_loop().run_in_executor(self.executor, function, *args)
        return await until_disconnected(request, future)


async def current_server(request: Request) -> Server:
    """The app's Server: a FastAPI dependency for every route (async: FastAPI runs a plain def in its thread pool)."""
    return request.app.state.server


def require(model, feature: str, how: str):
    """The model, or 424 saying how to start a server that has it."""
    if model is None:
        raise ApiError(424, "not_loaded", f"{feature} is not enabled on this server: {how}")
    return model


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
    except ApiError:  # the function said which answer itself (search: 424 for an index it cannot run)
        raise
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
