"""The text routes: tokenize and decode, fill-mask, classify / predict, rerank, search."""
from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Depends, Request

from ..tasks.classification.labels import shown_scores
from .embed_routes import ERRORS
from .errors import ApiError
from .index import search_within
from .inputs import as_list
from .responses import FastJSONResponse
from .schemas import (ClassifyRequest, DecodeRequest, FillMaskCandidate, FillMaskRequest, Prediction, PredictRequest,
                      Rank, RerankRequest, SearchHit, SearchRequest, Token, TokenizeRequest)
from .server import Server, current_server, require

router = APIRouter(responses=ERRORS)


@router.post("/tokenize", tags=["text"], response_model=list[list[Token]],
             summary="Tokens with ids and byte offsets (TEI's answer, and each WordPiece piece), in any of the "
                     "server's vocabularies")
async def tokenize(body: TokenizeRequest, server: Server = Depends(current_server)):
    models = server.models
    name = body.vocab or models.embedding.name
    if name not in models.vocabularies:
        raise ApiError(422, "validation", f"vocab {name!r} is not one of this server's vocabularies: "
                                          f"{', '.join(models.vocabularies)} (see GET /info)")
    prefix = server.encoders["embed"].prompts.prefix(body.prompt_name)
    texts = [prefix + text for text in as_list(body.inputs, "inputs", server.settings.max_client_batch_size)]
    table = await server.tokenized(token_table, models.vocabularies[name], texts, body.add_special_tokens)
    return FastJSONResponse(table)


def token_table(tokenizer, texts: list[str], add_special_tokens: bool) -> list[list[dict]]:
    """TEI's /tokenize answer: per text, per token {id, text, special, start, stop}, as TEI's `into_tokens` gives
    it: a real token's text is the input's own span (its case and accents; "ing", not "##ing") and start / stop
    are UTF-8 byte offsets into the input; a special token has its own name and no offsets. `piece`, beside
    them, is the vocabulary's piece ("##ing"), which the explorer's token table shows."""
    encoded = tokenizer(texts, add_special_tokens=add_special_tokens, return_offsets_mapping=True,
                        return_special_tokens_mask=True)
    return [[token_entry(i, piece, bool(special), start, stop, text, byte_offsets)
             for i, piece, special, (start, stop) in zip(ids, tokenizer.convert_ids_to_tokens(ids), specials, offsets)]
            for text, byte_offsets, ids, specials, offsets in zip(
                texts, map(utf8_offsets, texts), encoded["input_ids"], encoded["special_tokens_mask"],
                encoded["offset_mapping"])]


def token_entry(token_id: int, piece: str, special: bool, start: int, stop: int, text: str,
                byte_offsets: list[int] | None) -> dict:
    if special:
        return {"id": token_id, "text": piece, "special": True, "start": None, "stop": None, "piece": piece}
    byte_start, byte_stop = (start, stop) if byte_offsets is None else (byte_offsets[start], byte_offsets[stop])
    return {"id": token_id, "text": text[start:stop], "special": False, "start": byte_start, "stop": byte_stop,
            "piece": piece}


def utf8_offsets(text: str) -> list[int] | None:
    """Each character offset's UTF-8 byte offset (len(text) + 1 of them); None for ASCII, where they are equal."""
    if text.isascii():
        return None
    offsets = [0]
    for character in text:
        offsets.append(offsets[-1] + len(character.encode("utf-8", "surrogatepass")))
    return offsets


@router.post("/decode", tags=["text"], response_model=list[str], summary="Token ids back to text (TEI's /decode)")
async def decode(body: DecodeRequest, server: Server = Depends(current_server)):
    id_lists = as_list(body.ids, "ids", server.settings.max_client_batch_size)
    encoder = server.encoders["embed"]
    for index, ids in enumerate(id_lists):
        encoder.checked_ids(ids, index, len(id_lists))
    tokenizer = encoder.tokenizer
    return await server.tokenized(lambda: [tokenizer.engine_decode(ids, skip_special_tokens=body.skip_special_tokens)
                                           for ids in id_lists])  # TEI decodes with the tokenizers engine


@router.post("/fill-mask", tags=["text"],
             response_model=list[list[FillMaskCandidate]] | list[list[list[FillMaskCandidate]]],
             summary="The likeliest tokens for each [MASK]: per mask for one text, per text for a list")
async def fill_mask(body: FillMaskRequest, request: Request, server: Server = Depends(current_server)):
    masked_lm = require(server.models.masked_lm, "fill-mask", "start the server with an MLM checkpoint (--mlm DIR)")
    texts = as_list(body.inputs, "inputs", server.settings.max_client_batch_size)
    tokens = await server.tokenized(server.encoders["mlm"].encode, texts, body.truncate)
    for index, item in enumerate(tokens):
        if masked_lm.tokenizer.mask_token_id not in item.ids:
            which = "the text" if len(texts) == 1 else f"input {index}"
            raise ApiError(422, "validation", f"{which} has no [MASK] (or truncation cut it off); put [MASK] "
                                              "where a word should be predicted")
    top_k = min(body.top_k, masked_lm.tokenizer.vocab_size)
    results = await server.run_batched("fill-mask", [(t, top_k) for t in tokens], [len(t) for t in tokens], request)
    to_token = masked_lm.tokenizer.convert_ids_to_tokens
    answers = [[[{"token": t, "token_str": to_token(t), "score": p} for t, p in mask] for mask in masks]
               for masks in results]
    return FastJSONResponse(answers[0] if isinstance(body.inputs, str) else answers)


def ranked(labels: list[str], scores: np.ndarray) -> list[dict]:
    return [{"label": label, "score": float(score)} for label, score in
            sorted(zip(labels, scores), key=lambda pair: -pair[1])]


@router.post("/classify", tags=["text"], response_model=list[Prediction] | list[list[Prediction]],
             summary="Label probabilities from the fine-tuned --classifier, best first")
async def classify(body: ClassifyRequest, request: Request, server: Server = Depends(current_server)):
    classifier = require(server.models.classifier, "classify", "start the server with --classifier DIR")
    texts = as_list(body.inputs, "inputs", server.settings.max_client_batch_size)
    scores = await classified(server, texts, body.truncate, "right", request)
    answers = [ranked(classifier.labels, row) for row in scores]
    return FastJSONResponse(answers[0] if isinstance(body.inputs, str) else answers)


async def classified(server: Server, items: list, truncate: bool | None, direction, request: Request) -> list:
    """Each input's label scores (shown as the classifier's output function shows them), as `bertforge predict`
    gives them: a text over the classifier's limit is read in the overlapping windows it was fine-tuned to read and
    their scores combined (its data.combine), unless the request (or --auto-truncate) asks to cut it, as TEI cuts.
    Token-id inputs are taken as TEI takes them (422 when too long)."""
    classifier, encoder = server.models.classifier, server.encoders["classify"]
    if encoder.cuts(truncate) or not all(isinstance(item, str) for item in items):
        tokens = await server.tokenized(encoder.encode, items, truncate, direction)
        logits = await server.run_batched("classify", tokens, [len(t) for t in tokens], request)
        return [classifier.scores(row) for row in logits]
    windows, owners = await server.tokenized(classifier.windows, items, encoder.max_input_length)
    logits = await server.run_batched("classify", windows, [len(t) for t in windows], request)
    return classifier.combined(logits, owners, len(items))


def predict_inputs(inputs) -> tuple[list[list[str]], bool]:
    """TEI's /predict inputs -> ([text] or [text, text] per input, whether it was one input)."""
    if isinstance(inputs, str):
        return [[inputs]], True
    if inputs and isinstance(inputs[0], str):  # one text as [text], or one pair as [text, text]
        batch, single = [inputs], True
    else:
        batch, single = inputs, False
    for index, item in enumerate(batch):
        if len(item) not in (1, 2):
            raise ApiError(422, "validation", f"input {index} has {len(item)} texts; give a text, a pair "
                                              "[text, text], or a batch [[text], [text, text], ...]")
    return batch, single


async def predict_tokens(server: Server, batch: list[list[str]], truncate, direction) -> list:
    """Texts encoded alone, pairs as pairs (with their segment ids), in the batch's order."""
    encoder, tokens = server.encoders["classify"], [None] * len(batch)
    for size, encode, arguments in ((1, encoder.encode, (truncate, direction)),
                                    (2, encoder.encode_pairs, (truncate, direction))):
        rows = [i for i, item in enumerate(batch) if len(item) == size]
        if rows:
            items = [batch[i][0] if size == 1 else tuple(batch[i]) for i in rows]
            for row, item in zip(rows, await server.tokenized(encode, items, *arguments)):
                tokens[row] = item
    return tokens


@router.post("/predict", tags=["text"], response_model=list[Prediction] | list[list[Prediction]],
             summary="The --classifier's scores for a text or a pair, best first (TEI's /predict)")
async def predict(body: PredictRequest, request: Request, server: Server = Depends(current_server)):
    classifier = require(server.models.classifier, "predict", "start the server with --classifier DIR")
    batch, single = predict_inputs(body.inputs)
    as_list([" ".join(item) for item in batch], "inputs", server.settings.max_client_batch_size)  # empty, count
    if body.raw_scores:  # the logits themselves: an input that does not fit is cut or refused, as TEI does
        tokens = await predict_tokens(server, batch, body.truncate, body.truncation_direction)
        scores = await server.run_batched("classify", tokens, [len(t) for t in tokens], request)
    else:
        scores = await predicted(server, batch, body.truncate, body.truncation_direction, request)
    answers = [ranked(classifier.labels, row) for row in scores]
    return FastJSONResponse(answers[0] if single else answers)


async def predicted(server: Server, batch: list[list[str]], truncate, direction, request: Request) -> list:
    """Scores per input of /predict: single texts as /classify reads them (`classified`: a long text in windows),
    pairs cut longest first or refused, as `bertforge predict` and TEI read a pair."""
    classifier, scores = server.models.classifier, [None] * len(batch)
    singles = [i for i, item in enumerate(batch) if len(item) == 1]
    pairs = [i for i, item in enumerate(batch) if len(item) == 2]
    if singles:
        for row, score in zip(singles, await classified(server, [batch[i][0] for i in singles], truncate, direction,
                                                        request)):
            scores[row] = score
    if pairs:
        tokens = await server.tokenized(server.encoders["classify"].encode_pairs, [tuple(batch[i]) for i in pairs],
                                        truncate, direction)
        logits = await server.run_batched("classify", tokens, [len(t) for t in tokens], request)
        for row, logit in zip(pairs, logits):
            scores[row] = classifier.scores(logit)
    return scores


@router.post("/rerank", tags=["text"], response_model=list[Rank],
             summary="The texts ordered by the --reranker's score for (query, text), best first (TEI's /rerank)")
async def rerank(body: RerankRequest, request: Request, server: Server = Depends(current_server)):
    require(server.models.reranker, "rerank", "start the server with --reranker DIR (a one-label cross-encoder)")
    # A (query, text) pair is empty only when both are, as TEI reads a pair (a RAG chunk stripped to nothing
    # is scored, as sentence-transformers' CrossEncoder scores it, not a refusal of the whole request)
    texts = as_list(body.texts, "texts", server.settings.max_client_batch_size, empty_items=True)
    if not body.query and not all(texts):
        raise ApiError(400, "empty", f"the query and text {[bool(t) for t in texts].index(False)} are both empty; "
                                     "send a query or text in every pair")
    tokens = await server.tokenized(server.encoders["rerank"].encode_pairs, [(body.query, t) for t in texts],
                                    body.truncate, body.truncation_direction)
    logits = np.array([row[0] for row in await server.run_batched("rerank", tokens, [len(t) for t in tokens], request)])
    scores = shown_scores(logits, "none" if body.raw_scores else "sigmoid")  # TEI's and CrossEncoder's sigmoid
    order = np.argsort(-scores, kind="stable")
    return FastJSONResponse([{"index": int(i), **({"text": texts[i]} if body.return_text else {}),
                              "score": float(scores[i])} for i in order])


@router.post("/search", tags=["search"], response_model=list[list[SearchHit]], response_model_exclude_none=True,
             summary="The top-k texts of the --index for each query, best first (hybrid with BM25 by dense_weight)")
async def search(body: SearchRequest, request: Request, server: Server = Depends(current_server)):
    index = require(server.models.index, "search", "start the server with --index DIR")
    queries = as_list(body.query, "query", server.settings.max_client_batch_size)
    truncate = server.settings.auto_truncate if body.truncate is None else body.truncate
    hits = await server.run_on_model_thread(request, search_within, index, queries, body.top_k, body.dense_weight,
                                            server.settings, truncate, body.sentence_weight, body.neighbour_weight)
    return [[SearchHit(id=str(hit.id), text=hit.text, score=float(hit.score), dense_score=hit.dense_score,
                       lexical_score=hit.lexical_score) for hit in row] for row in hits]
