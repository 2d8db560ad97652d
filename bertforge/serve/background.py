"""Run the app under uvicorn in a background thread of this process, on a free loopback port.

For tests, benchmarks and screenshots (and notebooks): `with serving(app) as url: ...`
gives a real HTTP server, and stops it (gracefully: queued requests are answered) on exit.
"""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Iterator

import uvicorn

STARTUP_TIMEOUT_SECONDS = 60.0


@contextlib.contextmanager
def serving(app, host: str = "127.0.0.1", **uvicorn_options) -> Iterator[str]:
    """Yield the base URL (http://127.0.0.1:PORT) of `app` served in a thread; RuntimeError if it never starts."""
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listening.bind((host, 0))  # port 0: the kernel picks a free one, no race with other tests
    listening.listen(2048)
    port = listening.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **uvicorn_options))
    # uvicorn installs signal handlers only in the main thread; here the caller owns signals.
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True, name="bertforge-serve")
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server did not start on {host}:{port} within {STARTUP_TIMEOUT_SECONDS:g} s")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=STARTUP_TIMEOUT_SECONDS)
        listening.close()
