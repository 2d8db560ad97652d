"""The embedding routes' fast lane (serve/fast_lane.py): it answers what FastAPI would, byte for byte, and hands on
whatever it does not answer itself."""
import asyncio

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from bertforge.serve import app as app_module  # noqa: E402
from bertforge.serve.app import create_app  # noqa: E402
from bertforge.serve.errors import ApiError  # noqa: E402
from bertforge.serve.fast_lane import FastLane, Lane  # noqa: E402
from bertforge.serve.models import load_models  # noqa: E402
from bertforge.serve.responses import FastJSONResponse  # noqa: E402


class Body(BaseModel):
    inputs: str


async def handler(body: Body, request, server):
    if body.inputs == "refuse":
        raise ApiError(413, "validation", "too long")
    return FastJSONResponse({"echo": body.inputs, "server": server})


class Route:
    path = "/embed"


def run_asgi(app, path, body: bytes, method="POST", content_type=b"application/json", chunks=1, leave=False,
             headers=()):
    """One request through `app`: (status, headers, body) sent back."""
    scope = {"type": "http", "method": method, "path": path, "headers": [(b"content-type", content_type), *headers],
             "query_string": b"", "root_path": "", "scheme": "http", "server": ("testserver", 80)}
    size = -(-len(body) // chunks) or 1
    parts = [body[i:i + size] for i in range(0, len(body), size)] or [b""]
    messages = [{"type": "http.request", "body": part, "more_body": i < len(parts) - 1} for i, part in enumerate(parts)]
    messages = messages[:1] + [{"type": "http.disconnect"}] if leave else messages + [{"type": "http.disconnect"}]
    sent = []

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = next((m for m in sent if m["type"] == "http.response.start"), None)
    return (start and start["status"], start and dict(start["headers"]),
            b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))


class Downstream:
    """FastAPI's place: records what reached it, and the body it could read."""

    def __init__(self):
        self.calls = []

    async def __call__(self, scope, receive, send):
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        self.calls.append((scope["path"], body))
        await FastJSONResponse({"downstream": True}, status_code=422)(scope, receive, send)


@pytest.fixture
def lane():
    downstream = Downstream()
    return FastLane(downstream, server="the server", lanes={"/embed": Lane(Route(), Body, handler)}), downstream


def test_a_body_the_schema_accepts_is_answered_in_the_lane(lane):
    app, downstream = lane
    status, headers, body = run_asgi(app, "/embed", b'{"inputs": "hello"}', chunks=3)
    assert (status, body) == (200, b'{"echo":"hello","server":"the server"}')
    assert headers[b"content-type"] == b"application/json" and downstream.calls == []


@pytest.mark.parametrize("path, body, method, content_type", [
    ("/embed", b'{"inputs": 3}', "POST", b"application/json"),  # the schema refuses: FastAPI says why
    ("/embed", b'{"inputs": "x"', "POST", b"application/json"),  # not JSON
    ("/embed", b'{"inputs": "x"}', "POST", b"text/plain"),  # not sent as JSON
    ("/embed", b"", "GET", b"application/json"),
    ("/tokenize", b'{"inputs": "x"}', "POST", b"application/json"),  # not a lane
])
def test_everything_else_goes_on_with_its_body(lane, path, body, method, content_type):
    app, downstream = lane
    status, _, answer = run_asgi(app, path, body, method=method, content_type=content_type)
    assert (status, answer) == (422, b'{"downstream":true}') and downstream.calls == [(path, body)]


@pytest.mark.parametrize("authorization, answered", [(b"Bearer s3cret", True), (b"bearer  s3cret ", True),
                                                     (b"Bearer nope", False), (b"Basic s3cret", False), (None, False)])
def test_with_an_api_key_only_requests_carrying_it_take_the_lane(authorization, answered):
    downstream = Downstream()
    app = FastLane(downstream, server="the server", lanes={"/embed": Lane(Route(), Body, handler)}, api_key=b"s3cret")
    headers = [(b"authorization", authorization)] if authorization else []
    status, _, _ = run_asgi(app, "/embed", b'{"inputs": "hello"}', headers=headers)
    assert (status == 200, bool(downstream.calls)) == (answered, not answered)


def test_a_client_that_leaves_before_the_body_ends_gets_nothing(lane):
    app, downstream = lane
    assert run_asgi(app, "/embed", b'{"inputs": "hello"}', chunks=3, leave=True) == (None, None, b"")
    assert downstream.calls == []


def test_the_handlers_errors_are_answered_in_the_routes_shape(lane):
    app, _ = lane
    status, _, body = run_asgi(app, "/embed", b'{"inputs": "refuse"}')
    assert (status, body) == (413, b'{"error":"too long","error_type":"validation"}')


# --- against FastAPI, on the real routes --------------------------------------------------------------------------

REQUESTS = [
    ("/embed", {"inputs": "A short review."}),
    ("/embed", {"inputs": ["one", "two", "three"], "normalize": False, "dimensions": 8}),
    ("/embed", {"inputs": "x", "dimensions": 4096}),  # the handler's 422, as TEI answers a validation error
    ("/embed", {"inputs": []}),
    ("/embed", {"inputs": 7}),  # the schema's 422
    ("/embed", b'{"inputs": '),  # 400: not JSON
    ("/", {"inputs": "TEI's dispatch"}),
    ("/v1/embeddings", {"input": ["a", "b"], "model": "m"}),
    ("/v1/embeddings", {"input": "a", "encoding_format": "base64", "dimensions": 16}),
    ("/v1/embeddings", {"input": "a", "dimensions": 0}),
    ("/v1/embeddings", {"input": ["x"] * 3000}),  # over the request's input limit: OpenAI's error shape
]


@pytest.fixture(scope="module")
def served(minilm_dir):
    return load_models(str(minilm_dir))


def answers(app) -> list[tuple[int, bytes, str]]:
    with TestClient(app) as client:
        replies = [client.post(path, content=body, headers={"content-type": "application/json"})
                   if isinstance(body, bytes) else client.post(path, json=body) for path, body in REQUESTS]
        metrics = client.get("/metrics").text
    return [(r.status_code, r.content, r.headers["content-type"]) for r in replies], metrics


def test_the_lane_answers_byte_for_byte_as_fastapi_and_is_counted_under_its_route(served, monkeypatch):
    with_lane, metrics = answers(create_app(served))
    monkeypatch.setattr(app_module, "FAST_LANE_PATHS", ())
    without, _ = answers(create_app(served))
    assert [status for status, _, _ in with_lane] == [200, 200, 422, 400, 422, 400, 200, 200, 200, 422, 422]
    assert with_lane == without
    assert 'bertforge_requests_total{route="/embed",status="200"} 2.0' in metrics
    assert 'bertforge_requests_total{route="/v1/embeddings",status="200"} 2.0' in metrics
