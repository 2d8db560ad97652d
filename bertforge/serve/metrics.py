"""Prometheus metrics of one server: requests, latency, batches, tokens, queue depth.

Each app gets its own registry (not prometheus_client's global one), so several apps in
one process (tests) count separately; `GET /metrics` renders it in the text format.
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Seconds: from a few milliseconds (one short text) to a minute (a long queue on a CPU).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
BATCH_TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


class ServerMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("bertforge_requests", "HTTP requests answered, by route and status code",
                                ["route", "status"], registry=r)
        self.request_seconds = Histogram("bertforge_request_duration_seconds", "Time to answer a request, by route",
                                         ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("bertforge_requests_in_flight", "Model requests being served now (429 past the limit)",
                               registry=r)
        self.rejected = Counter("bertforge_requests_rejected", "Requests refused with 429 (over --max-concurrent-requests)",
                                registry=r)
        self.queue_depth = Gauge("bertforge_queue_depth", "Inputs waiting for a batch, by model", ["model"], registry=r)
        self.queue_seconds = Histogram("bertforge_queue_seconds", "Time an input waited in the queue",
                                       ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("bertforge_batch_size", "Inputs per model call", ["model"],
                                    buckets=BATCH_SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram("bertforge_batch_tokens", "Padded tokens per model call (inputs x longest)",
                                      ["model"], buckets=BATCH_TOKEN_BUCKETS, registry=r)
        self.tokens = Counter("bertforge_tokens", "Input tokens run through a model", ["model"], registry=r)
        self.inference_seconds = Histogram("bertforge_inference_seconds", "Time of one batched model call",
                                           ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.dropped = Counter("bertforge_inputs_dropped", "Queued inputs dropped unrun: their request was cancelled (client gone, or another of its inputs failed)",
                               ["model"], registry=r)


class RequestMetricsMiddleware:
    """Pure ASGI middleware counting each HTTP response by route template and status, with its latency.

    The route template (`/embed`, not the raw path) keeps the label set small: unknown
    paths are counted under "other".
    """

    def __init__(self, app, metrics: ServerMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), 500

        async def send_and_record(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            route = getattr(scope.get("route"), "path", "other")
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.request_seconds.labels(route).observe(time.perf_counter() - started)
