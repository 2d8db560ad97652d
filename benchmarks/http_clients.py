"""The benchmarks' HTTP clients: JSON POSTs on one keep-alive connection each, raw or through httpx.

`raw` writes HTTP/1.1 on an asyncio stream, as a load generator such as wrk does, and costs a small
fraction of httpx's CPU per request: on a machine that runs the clients beside the server, or beside
a GPU server whose passes take a millisecond, httpx's ~1 ms a request can be the bound being measured.
"""
from __future__ import annotations

import asyncio
import json
import re

import httpx


class RawConnection:
    """HTTP/1.1 keep-alive POSTs of JSON on one asyncio stream, as a load generator such as wrk sends
    them: a small fraction of httpx's CPU per request (httpx took ~1.1 ms, on the server's cores)."""

    def __init__(self, base: str):
        self.host, port = base.removeprefix("http://").rsplit(":", 1)
        self.port = int(port)

    async def __aenter__(self):
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc):
        self.writer.close()

    async def post(self, path: str, body: dict) -> tuple[int, bytes]:
        payload = json.dumps(body).encode()
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))
        return int(head.split(b" ", 2)[1]), await self.reader.readexactly(length)


class HttpxConnection:
    """The same POSTs through one httpx client per simulated client (as most Python callers send them)."""

    def __init__(self, base: str, timeout: float):
        self.http = httpx.AsyncClient(base_url=base, timeout=timeout)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.http.aclose()

    async def post(self, path: str, body: dict) -> tuple[int, bytes]:
        response = await self.http.post(path, json=body)
        return response.status_code, response.content


def connect(kind: str, base: str, timeout: float):
    """A connection of `kind` (raw or httpx) to base, to use as `async with`."""
    if kind == "raw":
        return RawConnection(base)
    if kind == "httpx":
        return HttpxConnection(base, timeout)
    raise ValueError(f"client {kind!r}: raw or httpx")
