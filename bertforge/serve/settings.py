"""The server's limits and switches: one dataclass, whose fields are `bertforge serve`'s options.

Each field's range is declared once in `bertforge.validation.BOUNDS` (the command line checks
it there; `checked` does for callers of `create_app`); `checked` adds only what depends on the
model (the input length against its position table).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import UsageError
from ..validation import check_fields

# text-embeddings-inference's defaults where it has them (--max-batch-tokens 16384,
# --max-concurrent-requests 512); OpenAI's where a drop-in needs them: 2,048 inputs per request
# (what the API accepts; LangChain's OpenAIEmbeddings sends 1,000 per call). 2,048 texts of 256
# tokens are ~3 MB of JSON, so the payload limit is TEI's 2 MB raised to 8 MB.
DEFAULT_MAX_BATCH_TOKENS = 16384
DEFAULT_MAX_CONCURRENT_REQUESTS = 512
DEFAULT_MAX_CLIENT_BATCH_SIZE = 2048
DEFAULT_PAYLOAD_LIMIT = 8_000_000
# A client that has not sent its whole body after this long gets 408 (a slow or stuck upload).
DEFAULT_BODY_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class ServeSettings:
    """How the server batches, limits and prepares requests (text-embeddings-inference's option names).

    Args:
        max_batch_tokens: padded tokens (inputs x longest) per batch; concurrent requests' inputs share batches
        max_batch_requests: inputs per batch at most (no limit but the tokens when not given)
        max_concurrent_requests: requests served at once; more get 429
        max_input_length: tokens per input, [CLS] and [SEP] included, for every served model (each model's own limit
            when not given); longer inputs get 422 unless the request or --auto-truncate truncates them
        max_client_batch_size: inputs per request; more get 422
        payload_limit: request body size limit in bytes; larger bodies get 413
        body_timeout_seconds: a body not received within this many seconds gets 408
        api_key: require 'Authorization: Bearer KEY' on the API (401 without, 403 with another key); the page,
            /health and the API docs stay open. Without it, the BERTFORGE_API_KEY variable if set
        auto_truncate: cut inputs longer than max_input_length instead of answering 422, when a request does not say
        default_prompt_name: the prompt (by name, from the model folder's prompts) put before every text a request
            sends without prompt_name
        default_prompt: the text put before every text a request sends without prompt_name
        threads: CPU threads for the models (default: OMP_NUM_THREADS if set, else the physical cores this process
            may use)
    """

    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    max_batch_requests: int | None = None
    max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS
    max_input_length: int | None = None
    max_client_batch_size: int = DEFAULT_MAX_CLIENT_BATCH_SIZE
    payload_limit: int = DEFAULT_PAYLOAD_LIMIT
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS
    api_key: str | None = None
    auto_truncate: bool = False
    default_prompt_name: str | None = None
    default_prompt: str | None = None
    threads: int | None = None

    def checked(self, model_max_length: int, other_lengths: Sequence[int] = ()) -> "ServeSettings":
        """These settings, checked against the embedding model's limit (model_max_length) and the other served
        models' (other_lengths); UsageError naming the setting that is wrong. max_input_length stays as given:
        `input_limit` says what each model reads."""
        check_fields(self, "ServeSettings.")
        if self.max_input_length is not None and not 2 <= self.max_input_length <= model_max_length:
            raise UsageError(f"--max-input-length {self.max_input_length} must be from 2 ([CLS] + [SEP]) to "
                             f"{model_max_length}, the model's limit")
        longest = max(self.input_limit(length) for length in (model_max_length, *other_lengths))
        if self.max_batch_tokens < longest:
            given = "--max-input-length" if self.max_input_length is not None else "a served model's limit"
            raise UsageError(f"--max-batch-tokens {self.max_batch_tokens} is smaller than the longest input, "
                             f"{longest} tokens ({given}): one input of the maximum length would never fit a batch; "
                             "raise --max-batch-tokens or lower --max-input-length")
        if self.api_key is not None and not self.api_key.strip():
            raise UsageError("the API key is empty; give a non-empty --api-key, or none to serve without one")
        if self.default_prompt is not None and self.default_prompt_name is not None:
            raise UsageError("--default-prompt and --default-prompt-name both say what goes before each text; give one")
        return self

    def input_limit(self, model_max_length: int) -> int:
        """Tokens per input for a served model of that limit: --max-input-length where given (it caps every model),
        else the model's own, so a 512-token classifier beside a 256-token embedder reads 512, as transformers'
        pipeline reads it."""
        return model_max_length if self.max_input_length is None else min(self.max_input_length, model_max_length)
