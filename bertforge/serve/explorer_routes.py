"""Routes behind the explorer page: what the server holds, attention maps, a word in context."""
from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Depends, Request

from .. import __version__
from ..embeddings.options import default_word_layers
from ..engine.precision import INFERENCE_DTYPES
from .errors import ApiError
from .explorer import ATTENTION_DECIMALS, ATTENTION_MAX_TOKENS, attention_maps, word_in_context
from .schemas import AttentionRequest, AttentionResponse, WordInContextRequest, WordInContextResponse
from .server import Server, current_server

info_router = APIRouter(tags=["explorer"])
router = APIRouter(tags=["explorer"])  # these run the model: the app adds the concurrency limit


@info_router.get("/info", summary="The models, vocabularies, prompts and limits of this server")
async def info(server: Server = Depends(current_server)) -> dict:
    models, settings, embedding = server.models, server.settings, server.models.embedding
    config = embedding.embedder.model.config
    classifier, index = models.classifier, models.index
    return {
        "model": embedding.name, "dimension": embedding.dim, "pooling": embedding.pooling,
        "layers": config.num_hidden_layers, "heads": config.num_attention_heads,
        "vocabularies": list(models.vocabularies),
        "fill_mask": models.masked_lm.name if models.masked_lm else None,
        "classifier": {"name": classifier.name, "labels": classifier.labels} if classifier else None,
        "reranker": models.reranker.name if models.reranker else None,
        "search": index is not None,
        # what POST /search ranks by when a request names no weights (the index's meta.json at start)
        "index": {"dense_weight": index.dense_weight, "hybrid": index.dense_weight < 1.0,
                  "sentence_weight": index.sentence_weight, "sentence_vectors": index.sentences is not None,
                  "neighbour_weight": index.neighbour_weight}
        if index else None,
        "prompts": list(models.prompts), "default_prompt": server.encoders["embed"].prompts.default,
        "word_layers": list(embedding.word_embedders),  # the first is the default, as word-in-context takes it
        "attention_max_tokens": ATTENTION_MAX_TOKENS,
        "max_input_length": settings.input_limit(embedding.max_length),
        "max_batch_tokens": settings.max_batch_tokens,
        "max_client_batch_size": settings.max_client_batch_size, "auto_truncate": settings.auto_truncate,
        "max_concurrent_requests": settings.max_concurrent_requests, "threads": server.threads,
        "threads_chosen_per_batch": server.governor is not None,
        **tei_info(server),
    }


def tei_info(server: Server) -> dict:
    """The fields of text-embeddings-inference's GET /info that the ones above do not already give, as TEI names
    them (its router's `Info`): the served model, its number format and kind (TEI serves one embedding model)."""
    embedding, settings = server.models.embedding, server.settings
    return {"model_id": embedding.name, "model_sha": None, "served_model_name": embedding.name,
            "model_dtype": INFERENCE_DTYPES[embedding.embedder.dtype],
            "model_type": {"embedding": {"pooling": embedding.pooling}},
            "max_batch_requests": settings.max_batch_requests, "tokenization_workers": 1,  # one tokenizer thread
            "version": __version__, "sha": None, "docker_label": None}


@router.post("/explorer/attention", response_model=AttentionResponse,
             summary=f"Every layer's and head's attention for a text (its first {ATTENTION_MAX_TOKENS} tokens)")
async def attention(body: AttentionRequest, request: Request, server: Server = Depends(current_server)):
    maps = await server.run_on_model_thread(request, attention_maps, server.models.embedding.explorer_embedder,
                                            body.text)
    return {"tokens": maps.tokens, "attentions": np.round(maps.attentions, ATTENTION_DECIMALS).tolist(),
            "word_ids": maps.word_ids, "truncated": maps.truncated}


@router.post("/explorer/word-in-context", response_model=WordInContextResponse,
             summary="A word's vector at each of its occurrences in several sentences: cosines, 2-D PCA")
async def word(body: WordInContextRequest, request: Request, server: Server = Depends(current_server)):
    embedding = server.models.embedding
    num_layers = embedding.embedder.model.config.num_hidden_layers
    layers = body.layers or default_word_layers(num_layers)  # as `bertforge senses` and word_vector choose
    embedder = embedding.word_embedders.get(layers)
    if embedder is None:
        raise ApiError(422, "validation", f"layers={layers!r} does not fit this {num_layers}-layer model; "
                                          f"use one of {', '.join(embedding.word_embedders)}")
    result = await server.run_on_model_thread(request, word_in_context, embedder, body.word, body.sentences)
    return {"sentences": body.sentences, "occurrences": result.occurrences, "layers": layers,
            "cosine": np.nan_to_num(result.cosine).tolist(),
            "points": np.nan_to_num(result.points).tolist(),
            "explained_variance": np.nan_to_num(result.explained_variance).tolist()}
