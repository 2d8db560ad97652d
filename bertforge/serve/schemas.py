"""Request and response bodies (pydantic), shaped as the APIs they imitate.

`/embed`, `/tokenize` and `/classify` take text-embeddings-inference's requests;
`/v1/embeddings` takes OpenAI's. Unknown fields are ignored, as both do, so clients
that send more than we use keep working.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, RootModel, StrictBool, StrictFloat, StrictInt, StrictStr

from ..embeddings.options import DEFAULT_WORD_LAYERS, WordLayers

# Strict types: "normalize": "yes" or "inputs": [1.5] is a 422, not a guess (pydantic's lax mode
# would read "yes" as true). Token ids are the model's own, without [CLS]/[SEP].
TokenIds = list[StrictInt]
Inputs = StrictStr | list[StrictStr]
EmbedInputs = StrictStr | TokenIds | list[StrictStr | TokenIds]
Direction = Literal["right", "left", "Right", "Left"]
TRUNCATE = Field(None, description="cut inputs longer than the max input length instead of 422 (default: the "
                                   "server's --auto-truncate)")
DIRECTION = Field("right", description="which end a truncated input loses")
PROMPT_NAME = Field(None, description="a prompt of the model's (GET /info) put before each text")


class EmbedRequest(BaseModel):
    inputs: EmbedInputs = Field(description="a text, a list of texts, or token ids (one list, or a list of lists)",
                                examples=["What is Deep Learning?"])
    truncate: StrictBool | None = TRUNCATE
    truncation_direction: Direction = DIRECTION
    prompt_name: StrictStr | None = PROMPT_NAME
    normalize: StrictBool = Field(True, description="L2-normalise each vector (a dot product is then the cosine)")
    dimensions: StrictInt | None = Field(None, ge=1, description="keep the first N components (then normalise)")


class EmbedResponse(RootModel[list[list[float]]]):
    """One vector per input, in order."""


class EmbedAllRequest(BaseModel):
    inputs: EmbedInputs
    truncate: StrictBool | None = TRUNCATE
    truncation_direction: Direction = DIRECTION
    prompt_name: StrictStr | None = PROMPT_NAME


class SparseValue(BaseModel):
    index: int
    value: float


class SimilarityInput(BaseModel):
    source_sentence: StrictStr
    sentences: list[StrictStr]


class SimilarityParameters(BaseModel):
    truncate: StrictBool | None = TRUNCATE
    truncation_direction: Direction = DIRECTION
    prompt_name: StrictStr | None = PROMPT_NAME


class SimilarityRequest(BaseModel):
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None


class OpenAIEmbeddingRequest(BaseModel):
    input: EmbedInputs = Field(description="a text, a list of up to 2,048 texts, token ids, or a list of token-id lists")
    model: StrictStr | None = Field(None, description="echoed back: the server embeds with the model it was started with")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: each vector as little-endian float32 bytes (what the openai client asks for)")
    dimensions: StrictInt | None = Field(None, ge=1, description="keep the first N components, renormalised")
    user: StrictStr | None = Field(None, description="accepted and ignored")
    truncate: StrictBool | None = Field(None, description="not OpenAI's: cut inputs over the max input length "
                                                          "instead of 422 (the openai client sends it with extra_body)")


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
    add_special_tokens: StrictBool = True
    prompt_name: StrictStr | None = PROMPT_NAME
    vocab: str | None = Field(None, description="one of the vocabularies in GET /info (default: the model's)")


class Token(BaseModel):
    id: int
    text: str = Field(description="the input's span (a special token's name), as TEI gives it")
    special: bool
    start: int | None = Field(description="UTF-8 byte offset where the token starts, as TEI's (None: special)")
    stop: int | None
    piece: str = Field(description="the vocabulary's piece, e.g. ##ing (bertforge's, beside TEI's fields)")


class DecodeRequest(BaseModel):
    ids: TokenIds | list[TokenIds]
    skip_special_tokens: StrictBool = True


class FillMaskRequest(BaseModel):
    inputs: Inputs = Field(description="a text with one or more [MASK] tokens, or a list of them",
                           examples=["The capital of France is [MASK]."])
    top_k: StrictInt = Field(5, ge=1, le=100)
    truncate: StrictBool | None = TRUNCATE


class FillMaskCandidate(BaseModel):
    token: int
    token_str: str
    score: float


class ClassifyRequest(BaseModel):
    inputs: Inputs
    truncate: StrictBool | None = TRUNCATE


class Prediction(BaseModel):
    label: str
    score: float


class PredictRequest(BaseModel):
    inputs: StrictStr | list[StrictStr] | list[list[StrictStr]] = Field(
        description="a text, a pair [text, text], or a batch [[text], [text, text], ...] (TEI's /predict)")
    truncate: StrictBool | None = TRUNCATE
    truncation_direction: Direction = DIRECTION
    raw_scores: StrictBool = Field(False, description="the logits instead of probabilities")


class RerankRequest(BaseModel):
    query: StrictStr
    texts: list[StrictStr]
    truncate: StrictBool | None = TRUNCATE
    truncation_direction: Direction = DIRECTION
    raw_scores: StrictBool = Field(False, description="the logit instead of its sigmoid")
    return_text: StrictBool = False


class Rank(BaseModel):
    index: int
    text: str | None = None
    score: float


class SearchRequest(BaseModel):
    query: Inputs = Field(description="a query, or a list of queries")
    top_k: StrictInt = Field(10, ge=1, le=100)
    dense_weight: StrictFloat | None = Field(None, ge=0, le=1, description="the encoder's share of a hybrid ranking "
                                             "with BM25 (1: the encoder alone, 0: BM25 alone; default: the index's)")
    sentence_weight: StrictFloat | None = Field(None, ge=0, le=1, description="the share of each passage's best "
                                                "sentence in the encoder's score (0: the passage vectors alone; above "
                                                "0 needs an index built with sentence vectors; default: the index's)")
    neighbour_weight: StrictFloat | None = Field(None, ge=0, le=1, description="the share of each passage's best "
                                                 "neighbour in the same document in its score (0: each passage "
                                                 "alone; default: the index's)")
    truncate: StrictBool | None = TRUNCATE


class SearchHit(BaseModel):
    id: str
    text: str
    score: float = Field(description="cosine similarity; in a hybrid search the fused score")
    dense_score: float | None = Field(None, description="a hybrid search's parts: the cosine similarity")
    lexical_score: float | None = Field(None, description="and the BM25 score")


class AttentionRequest(BaseModel):
    text: str = Field(max_length=10_000, examples=["The bank raised its interest rates."])


class AttentionResponse(BaseModel):
    tokens: list[str]
    attentions: list[list[list[list[float]]]] = Field(description="[layer][head][query token][key token]")
    word_ids: list[int | None] = Field(description="per token, the index of the word it is a piece of "
                                                    "(null for [CLS] and [SEP])")
    truncated: bool


class WordInContextRequest(BaseModel):
    word: str = Field(min_length=1, max_length=100, examples=["bank"])
    sentences: list[str] = Field(min_length=2, max_length=32)
    layers: WordLayers | None = Field(None, description=f"default {DEFAULT_WORD_LAYERS} (the last layer on a model "
                                                        "with fewer than three), as `bertforge senses`")


class WordOccurrence(BaseModel):
    sentence: int = Field(description="index of the sentence it is in")
    label: str = Field(description="the sentence's number, and the occurrence's (2.1, 2.2) when it has several")
    context: str = Field(description="the sentence with this occurrence in [brackets]")


class WordInContextResponse(BaseModel):
    sentences: list[str]
    occurrences: list[WordOccurrence] = Field(description="every occurrence of the word, in order: one point each")
    cosine: list[list[float]]
    points: list[list[float]]
    explained_variance: list[float]
    layers: str = Field(description="the layers the vectors were read from")
