"""Routes behind the explorer page: what the server holds, attention maps, a word in context."""
from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request

from .errors import ApiError
from .explorer import ATTENTION_DECIMALS, ATTENTION_MAX_TOKENS, attention_maps, word_in_context
from .schemas import AttentionRequest, AttentionResponse, WordInContextRequest, WordInContextResponse


def explorer_router(server, admitted) -> APIRouter:
    """admitted: the concurrency-limit dependency, for the routes that run the model."""
    router = APIRouter(tags=["explorer"])
    models, settings = server.models, server.settings
    embedding = models.embedding

    @router.get("/info", summary="The models, vocabularies and limits of this server")
    async def info() -> dict:
        config = embedding.embedder.model.config
        classifier = models.classifier
        return {
            "model": embedding.name, "dimension": embedding.dim, "pooling": embedding.pooling,
            "layers": config.num_hidden_layers, "heads": config.num_attention_heads,
            "vocabularies": list(models.vocabularies),
            "fill_mask": models.masked_lm.name if models.masked_lm else None,
            "classifier": {"name": classifier.name, "labels": classifier.labels} if classifier else None,
            "search": models.index is not None,
            "word_layers": list(embedding.word_embedders),
            "attention_max_tokens": ATTENTION_MAX_TOKENS,
            "max_input_length": settings.max_input_length, "max_batch_tokens": settings.max_batch_tokens,
            "max_client_batch_size": settings.max_client_batch_size,
            "max_concurrent_requests": settings.max_concurrent_requests,
        }

    @router.post("/explorer/attention", response_model=AttentionResponse, dependencies=[admitted],
                 summary=f"Every layer's and head's attention for a text (its first {ATTENTION_MAX_TOKENS} tokens)")
    async def attention(body: AttentionRequest, request: Request):
        maps = await server.run_on_model_thread(request, attention_maps, embedding.embedder, body.text)
        return {"tokens": maps.tokens, "attentions": np.round(maps.attentions, ATTENTION_DECIMALS).tolist(),
                "truncated": maps.truncated}

    @router.post("/explorer/word-in-context", response_model=WordInContextResponse, dependencies=[admitted],
                 summary="A word's vectors in several sentences: their cosines and 2-D PCA")
    async def word(body: WordInContextRequest, request: Request):
        embedder = embedding.word_embedders.get(body.layers)
        if embedder is None:
            layers = embedding.embedder.model.config.num_hidden_layers
            raise ApiError(422, "validation", f"layers={body.layers!r} does not fit this {layers}-layer model; "
                                              f"use one of {', '.join(embedding.word_embedders)}")
        result = await server.run_on_model_thread(request, word_in_context, embedder, body.word, body.sentences)
        return {"sentences": body.sentences, "cosine": np.nan_to_num(result.cosine).tolist(),
                "points": np.nan_to_num(result.points).tolist(),
                "explained_variance": np.nan_to_num(result.explained_variance).tolist()}

    return router
