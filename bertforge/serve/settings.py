"""The server's limits and switches, checked once where they enter (the CLI or create_app)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError

# text-embeddings-inference's defaults where it has them (--max-batch-tokens 16384,
# --max-concurrent-requests 512, --max-client-batch-size 32, a 2 MB payload limit).
DEFAULT_MAX_BATCH_TOKENS = 16384
DEFAULT_MAX_CONCURRENT_REQUESTS = 512
DEFAULT_MAX_CLIENT_BATCH_SIZE = 32
DEFAULT_MAX_REQUEST_BYTES = 2_000_000
# A client that has not sent its whole body after this long gets 408 (a slow or stuck upload).
DEFAULT_BODY_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class ServeSettings:
    """max_input_length: tokens per input, [CLS] and [SEP] included; None means the embedding
    model's own truncation length. Longer inputs get 413 unless the request asks to truncate.
    api_key: when set, every API route wants `Authorization: Bearer <api_key>` (401 without it,
    403 with another key); the explorer page, /health and the API docs stay open.
    """

    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    max_batch_requests: int | None = None
    max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS
    max_input_length: int | None = None
    max_client_batch_size: int = DEFAULT_MAX_CLIENT_BATCH_SIZE
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS
    api_key: str | None = None

    def checked(self, model_max_length: int) -> "ServeSettings":
        """These settings with max_input_length filled in; ValueError naming the setting that is wrong."""
        for name in ("max_batch_tokens", "max_concurrent_requests", "max_client_batch_size", "max_request_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.max_batch_requests is not None and self.max_batch_requests < 1:
            raise UsageError(f"--max-batch-requests must be a positive integer, got {self.max_batch_requests!r}")
        if not self.body_timeout_seconds > 0:
            raise UsageError(f"the body timeout must be positive, got {self.body_timeout_seconds!r} seconds")
        max_input_length = self.max_input_length if self.max_input_length is not None else model_max_length
        if not 2 <= max_input_length <= model_max_length:
            raise UsageError(f"--max-input-length {max_input_length} must be from 2 ([CLS] + [SEP]) to "
                             f"{model_max_length}, the model's limit")
        if self.max_batch_tokens < max_input_length:
            raise UsageError(f"--max-batch-tokens {self.max_batch_tokens} is smaller than --max-input-length "
                             f"{max_input_length}: one input of the maximum length would never fit a batch; "
                             "raise --max-batch-tokens or lower --max-input-length")
        if self.api_key is not None and not self.api_key.strip():
            raise UsageError("the API key is empty; give a non-empty --api-key, or none to serve without one")
        return ServeSettings(**{**self.__dict__, "max_input_length": max_input_length})
