"""The embedding routes' requests answered without FastAPI's per-request machinery.

With one text a request, the event loop's own work is what keeps the model waiting between batches:
16 one-text clients on 2 cores left it idle 9% of the time, the loop spending 0.37 ms a request, two
thirds of it in FastAPI's request cycle (dependencies, the body read and parsed twice over, the
validation, the exception middleware and exit stack) around a handler that needs little of it.
`FastLane`, innermost of the server's middlewares, answers POST /embed, / (TEI's dispatch) and
/v1/embeddings itself: the body validated by the route's own pydantic schema in one step from its
bytes, the route's own handler called, its response sent. Anything else goes on to FastAPI
unchanged (a request without the server's --api-key too), and so does a body the schema refuses
(its bytes handed on): FastAPI's answer, in the error shapes of errors.py, stays the only rule for
a bad request. Errors the handler raises are
answered by the same functions FastAPI's handlers call (errors.error_response_for).
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import Request
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from .errors import error_response_for
from .guards import authorized
from .server import Server

Handler = Callable[[BaseModel, Request, Server], Awaitable]


@dataclass(frozen=True)
class Lane:
    route: APIRoute  # put in the scope as FastAPI's router does: the metrics label requests by its path
    schema: type[BaseModel]
    handler: Handler


def lanes_for(routes, paths: tuple[str, ...]) -> dict[str, Lane]:
    """{path: Lane} for the POST routes at `paths`, each with its body's schema and its endpoint."""
    lanes = {}
    for route in routes:
        if isinstance(route, APIRoute) and route.path in paths and "POST" in route.methods:
            schema = route.dependant.body_params[0].field_info.annotation
            lanes[route.path] = Lane(route, schema, route.endpoint)
    return lanes


class FastLane:
    """Pure ASGI middleware: the lanes' requests with a JSON body their schema accepts, answered here (with the
    server's key, when it has one: a request without it goes on, and the routes' dependency answers 401 / 403)."""

    def __init__(self, app, server: Server, lanes: dict[str, Lane], api_key: bytes | None = None):
        self.app, self.server, self.lanes, self.api_key = app, server, lanes, api_key

    async def __call__(self, scope, receive, send):
        lane = self.lanes.get(scope.get("path")) if scope["type"] == "http" and scope["method"] == "POST" else None
        if lane is None or not sends_json(scope) or (self.api_key is not None and not authorized(scope, self.api_key)):
            return await self.app(scope, receive, send)
        try:
            body = await read_body(receive)
        except HTTPException as error:  # the body guard's 413 / 408 (guards.BodyLimitMiddleware)
            return await error_response_for(Request(scope), error)(scope, receive, send)
        if body is None:  # the client left before the body ended: nothing to answer
            return
        try:
            parsed = lane.schema.model_validate_json(body)
        except ValidationError:
            return await self.app(scope, replayed(body, receive), send)  # FastAPI says what is wrong
        scope["route"] = lane.route
        request = Request(scope, receive)
        try:
            response = await lane.handler(parsed, request, self.server)
        except Exception as error:  # noqa: BLE001 - answered as FastAPI's handlers answer it
            response = error_response_for(request, error)
        await response(scope, receive, send)


def sends_json(scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.split(b";")[0].strip().lower() == b"application/json"
    return False


async def read_body(receive) -> bytes | None:
    """The request's body (None when the client disconnected first)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def replayed(body: bytes, receive):
    """A receive that gives `body` once, then what `receive` gives."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replay
