"""bertforge over HTTP: the API (embed, tokenize, fill-mask, classify, search) with dynamic
batching, Prometheus metrics, and the explorer page. Needs the `serve` extra (FastAPI, uvicorn).

Nothing is imported here, so `bertforge --help` works without that extra; use
`bertforge.serve.app.create_app` and `bertforge.serve.models.load_models`.
"""
