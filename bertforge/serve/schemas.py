"""Request and response bodies (pydantic), shaped as the APIs they imitate.

`/embed`, `/tokenize` and `/classify` take text-embeddings-inference's requests;
`/v1/embeddings` takes OpenAI's. Unknown fields are ignored, as both do, so clients
that send more than we use keep working.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, RootModel

Inputs = str | list[str]


class EmbedRequest(BaseModel):
    inputs: Inputs = Field(description="a text, or a list of texts", examples=["What is Deep Learning?"])
    truncate: bool = Field(False, description="cut texts longer than the server's max input length instead of 413")
    normalize: bool = Field(True, description="L2-normalise each vector (a dot product is then the cosine)")


class EmbedResponse(RootModel[list[list[float]]]):
    """One vector per input text, in order."""


class OpenAIEmbeddingRequest(BaseModel):
    input: Inputs | list[int] | list[list[int]] = Field(description="a text or a list of texts (token arrays are refused)")
    model: str | None = Field(None, description="ignored: the server embeds with the model it was started with")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: each vector as little-endian float32 bytes (what the openai client asks for)")
    dimensions: int | None = Field(None, description="must be the model's dimension if given")
    user: str | None = None
    truncate: bool = Field(False, description="not OpenAI's: cut texts over the max input length instead of 413 "
                                              "(the openai client sends it with extra_body)")


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str
    index: int


class OpenAIUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


class TokenizeRequest(BaseModel):
    inputs: Inputs
    add_special_tokens: bool = True
    vocab: str | None = Field(None, description="one of the vocabularies in GET /info (default: the model's)")


class Token(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None = Field(description="character offset where the token starts (None for special tokens)")
    stop: int | None


class FillMaskRequest(BaseModel):
    inputs: Inputs = Field(description="a text with one or more [MASK] tokens, or a list of them",
                           examples=["The capital of France is [MASK]."])
    top_k: int = Field(5, ge=1, le=100)
    truncate: bool = False


class FillMaskCandidate(BaseModel):
    token: int
    token_str: str
    score: float


class ClassifyRequest(BaseModel):
    inputs: Inputs
    truncate: bool = False


class Prediction(BaseModel):
    label: str
    score: float


class SearchRequest(BaseModel):
    query: Inputs = Field(description="a query, or a list of queries")
    top_k: int = Field(10, ge=1, le=100)


class SearchHit(BaseModel):
    id: str
    text: str
    score: float


class AttentionRequest(BaseModel):
    text: str = Field(max_length=10_000, examples=["The bank raised its interest rates."])


class AttentionResponse(BaseModel):
    tokens: list[str]
    attentions: list[list[list[list[float]]]] = Field(description="[layer][head][query token][key token]")
    truncated: bool


class WordInContextRequest(BaseModel):
    word: str = Field(min_length=1, max_length=100, examples=["bank"])
    sentences: list[str] = Field(min_length=2, max_length=32)
    layers: Literal["last_four_mean", "last", "second_to_last"] = "last_four_mean"


class WordInContextResponse(BaseModel):
    sentences: list[str]
    cosine: list[list[float]]
    points: list[list[float]]
    explained_variance: list[float]
