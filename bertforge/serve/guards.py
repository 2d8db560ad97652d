"""What keeps the server up under bad or heavy traffic: body size and time limits, the
concurrency limit (429) and the optional API key (401/403)."""
from __future__ import annotations

import asyncio
import hmac
import json

from fastapi import Depends
from fastapi.security.utils import get_authorization_scheme_param
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from .errors import ApiError, error_body
from .metrics import ServerMetrics


class BodyLimitMiddleware:
    """Pure ASGI middleware: 413 for a body over max_bytes, 408 for one that arrives too slowly.

    A declared Content-Length over the limit is refused before a byte of the body is read;
    a chunked body is counted as it arrives. `timeout` bounds the wait for each chunk, so a
    client that stalls mid-upload gives its connection back instead of holding it forever.
    """

    def __init__(self, app, max_bytes: int, timeout: float):
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await refuse(scope, send, 413, "validation", self.too_large_message())
        received, body_done = 0, False

        async def limited_receive():
            nonlocal received, body_done
            if body_done:  # afterwards the app only listens for a disconnect: no deadline
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.timeout)
            except asyncio.TimeoutError:
                raise HTTPException(408, f"the request body did not arrive within {self.timeout:g} s; "
                                         "send the whole body at once") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, self.too_large_message())
                body_done = not message.get("more_body", False)
            return message

        await self.app(scope, limited_receive, send)

    def too_large_message(self) -> str:
        return (f"the request body is larger than the server's limit of {self.max_bytes:,} bytes "
                "(--payload-limit); send fewer or shorter inputs per request")


async def refuse(scope, send, status: int, error_type: str, message: str, headers: list | None = None) -> None:
    """An answer before the route runs: the error body every route answers with (errors.error_body), and the
    connection closed, as the request's body is left unread."""
    body = json.dumps(error_body(scope["path"], status, error_type, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class ConcurrencyLimitMiddleware:
    """Pure ASGI middleware: at most `limit` model requests at once, 429 beyond; other requests pass.

    Refusing at once (no waiting room beyond the batch queue) is text-embeddings-inference's
    behaviour: the client, or its load balancer, decides where to retry. The model requests are the
    (method, path) pairs in `limited`, read from the model routers when the app is built. A middleware
    rather than a route dependency: a dependency with cleanup (`yield`) cost the event loop 5-10% of its
    time per one-text request (FastAPI's exit stack, anyio's cancel scopes), and this refuses before
    a byte of the body is read.
    """

    def __init__(self, app, limit: int, metrics: ServerMetrics, limited: set[tuple[str, str]]):
        self.app, self.limit, self.metrics, self.limited = app, limit, metrics, frozenset(limited)
        self.active = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or (scope["method"], scope["path"]) not in self.limited:
            return await self.app(scope, receive, send)
        if self.active >= self.limit:
            self.metrics.rejected.inc()
            return await refuse(
                scope, send, 429, "overloaded", f"the server is answering its limit of {self.limit} concurrent requests "
                                         "(--max-concurrent-requests); retry shortly", [(b"retry-after", b"1")])
        self.active += 1
        self.metrics.in_flight.set(self.active)
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1
            self.metrics.in_flight.set(self.active)


def api_key_check(api_key: str | None):
    """A dependency checking `Authorization: Bearer <key>` when the server has a key; a no-op otherwise."""
    bearer = HTTPBearer(auto_error=False, description="the server's --api-key")
    expected = api_key.encode() if api_key else None

    async def check(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)):
        if expected is None:
            return
        if credentials is None:
            raise ApiError(401, "unauthorized", "this server wants an API key: send the header "
                                                "'Authorization: Bearer <key>'", {"WWW-Authenticate": "Bearer"})
        if not key_matches(credentials.credentials, expected):
            raise ApiError(403, "forbidden", "the API key is not this server's; check the key you were given")

    return check


def key_matches(token: str, expected: bytes) -> bool:
    return hmac.compare_digest(token.encode(), expected)  # constant time: no timing oracle


def authorized(scope, expected: bytes) -> bool:
    """Whether an ASGI request carries `Authorization: Bearer <the key>`, read as HTTPBearer reads it (the fast
    lane's check; a request that fails it goes on to the routes, whose dependency answers 401 or 403)."""
    header = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
    scheme, token = get_authorization_scheme_param(header.decode("latin-1"))
    return scheme.lower() == "bearer" and bool(token) and key_matches(token, expected)
