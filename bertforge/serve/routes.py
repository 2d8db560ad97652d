"""The API routes: embed (text-embeddings-inference and OpenAI shapes), tokenize, fill-mask, classify, search."""
from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from .errors import ApiError
from .schemas import (ClassifyRequest, EmbedRequest, EmbedResponse, FillMaskCandidate, FillMaskRequest,
                      OpenAIEmbeddingRequest, OpenAIEmbeddingResponse, Prediction, SearchHit, SearchRequest, Token,
                      TokenizeRequest)

# What each route answers besides 200, for the OpenAPI page (text-embeddings-inference's codes).
ERRORS = {400: {"description": "empty input or a body that is not JSON"},
          413: {"description": "too many inputs, an input over --max-input-length, or a body over the size limit"},
          422: {"description": "a field of the wrong type or value"},
          424: {"description": "the model failed, or the feature was not loaded"},
          429: {"description": "over --max-concurrent-requests"}}


def normalized(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True).clip(min=1e-12)


def api_router(server) -> APIRouter:
    router = APIRouter(responses=ERRORS)
    models = server.models
    embed_checker = server.checker(models.embedding.tokenizer)

    async def embed_texts(texts: list[str], truncate: bool, request: Request) -> tuple[np.ndarray, int]:
        """(float32 (len(texts), dim) pooled vectors, total input tokens)."""
        id_lists = server.encode(embed_checker, texts, truncate)
        vectors = await server.run_batched("embed", id_lists, [len(ids) for ids in id_lists], request)
        return np.stack(vectors), sum(len(ids) for ids in id_lists)

    @router.post("/embed", tags=["embeddings"], response_model=EmbedResponse,
                 summary="Sentence vectors (text-embeddings-inference's /embed)")
    async def embed(body: EmbedRequest, request: Request):
        vectors, _ = await embed_texts(server.texts(body.inputs), body.truncate, request)
        # Built here rather than through response_model: validating 32 x 384 floats costs more than the model.
        return JSONResponse((normalized(vectors) if body.normalize else vectors).tolist())

    @router.post("/v1/embeddings", tags=["embeddings"], response_model=OpenAIEmbeddingResponse,
                 summary="Sentence vectors, OpenAI's embeddings API (normalised, as OpenAI's are)")
    async def openai_embeddings(body: OpenAIEmbeddingRequest, request: Request):
        if isinstance(body.input, list) and body.input and not isinstance(body.input[0], str):
            raise ApiError(422, "validation", "input holds token ids; this server takes text: send a string or a "
                                              "list of strings")
        if body.dimensions is not None and body.dimensions != models.embedding.dim:
            raise ApiError(422, "validation", f"dimensions={body.dimensions}, but this model gives "
                                              f"{models.embedding.dim}-dimensional vectors; leave dimensions out")
        vectors, tokens = await embed_texts(server.texts(body.input, "input"), body.truncate, request)
        vectors = normalized(vectors)
        if body.encoding_format == "base64":
            embeddings = [base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in vectors]
        else:
            embeddings = vectors.tolist()
        return JSONResponse({"object": "list", "model": body.model or models.embedding.name,
                             "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(embeddings)],
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    @router.post("/tokenize", tags=["text"], response_model=list[list[Token]],
                 summary="WordPiece tokens with ids and character offsets, in any of the server's vocabularies")
    async def tokenize(body: TokenizeRequest) -> list[list[Token]]:
        name = body.vocab or models.embedding.name
        if name not in models.vocabularies:
            raise ApiError(422, "validation", f"vocab {name!r} is not one of this server's vocabularies: "
                                              f"{', '.join(models.vocabularies)} (see GET /info)")
        tokenizer = models.vocabularies[name]
        encoded = tokenizer(server.texts(body.inputs), add_special_tokens=body.add_special_tokens,
                            return_offsets_mapping=True, return_special_tokens_mask=True)
        return [[Token(id=i, text=text, special=bool(special), start=None if special else start,
                       stop=None if special else stop)
                 for i, text, special, (start, stop) in zip(ids, tokenizer.convert_ids_to_tokens(ids), specials, offsets)]
                for ids, specials, offsets in zip(encoded["input_ids"], encoded["special_tokens_mask"],
                                                  encoded["offset_mapping"])]

    mlm_checker = server.checker(models.masked_lm.tokenizer) if models.masked_lm else None

    @router.post("/fill-mask", tags=["text"], response_model=list[list[FillMaskCandidate]] | list[list[list[FillMaskCandidate]]],
                 summary="The likeliest tokens for each [MASK]: per mask for one text, per text for a list")
    async def fill_mask(body: FillMaskRequest, request: Request):
        masked_lm = require(models.masked_lm, "fill-mask", "start the server with an MLM checkpoint (--mlm DIR)")
        texts = server.texts(body.inputs)
        id_lists = server.encode(mlm_checker, texts, body.truncate)
        mask_id = masked_lm.tokenizer.mask_token_id
        for index, ids in enumerate(id_lists):
            if mask_id not in ids:
                which = "the text" if len(texts) == 1 else f"input {index}"
                raise ApiError(422, "validation", f"{which} has no [MASK] (or truncation cut it off); put [MASK] "
                                                  "where a word should be predicted")
        results = await server.run_batched("fill-mask", [(ids, body.top_k) for ids in id_lists],
                                           [len(ids) for ids in id_lists], request)
        to_token = masked_lm.tokenizer.convert_ids_to_tokens
        answers = [[[FillMaskCandidate(token=t, token_str=to_token(t), score=p) for t, p in mask] for mask in masks]
                   for masks in results]
        return answers[0] if isinstance(body.inputs, str) else answers

    classifier_checker = server.checker(models.classifier.tokenizer) if models.classifier else None

    @router.post("/classify", tags=["text"], response_model=list[Prediction] | list[list[Prediction]],
                 summary="Label probabilities from the fine-tuned --classifier, best first")
    async def classify(body: ClassifyRequest, request: Request):
        classifier = require(models.classifier, "classify", "start the server with --classifier DIR")
        id_lists = server.encode(classifier_checker, server.texts(body.inputs), body.truncate)
        scores = await server.run_batched("classify", id_lists, [len(ids) for ids in id_lists], request)
        answers = [sorted((Prediction(label=label, score=float(s)) for label, s in zip(classifier.labels, row)),
                          key=lambda p: -p.score) for row in scores]
        return answers[0] if isinstance(body.inputs, str) else answers

    @router.post("/search", tags=["search"], response_model=list[list[SearchHit]],
                 summary="The top-k texts of the --index for each query, best first")
    async def search(body: SearchRequest, request: Request) -> list[list[SearchHit]]:
        index = require(models.index, "search", "start the server with --index DIR")
        queries = server.texts(body.query, "query")
        hits = await server.run_on_model_thread(request, index.search, queries, body.top_k)
        return [[SearchHit(id=str(hit.id), text=hit.text, score=float(hit.score)) for hit in row] for row in hits]

    return router


def require(model, feature: str, how: str):
    if model is None:
        raise ApiError(424, "not_loaded", f"{feature} is not enabled on this server: {how}")
    return model
