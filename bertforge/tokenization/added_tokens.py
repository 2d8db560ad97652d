"""Tokens added to a WordPiece vocabulary: transformers' `add_tokens` and additional special tokens ("[E1]",
"<drug>", "covid19"), read from a folder's files and matched in the text before WordPiece, as transformers and
sentence-transformers match them.

A folder keeps them in one of three places, by the transformers version that saved it: tokenizer.json's
`added_tokens` (every fast tokenizer; transformers 5 saves nothing else), tokenizer_config.json's
`added_tokens_decoder` (transformers 4.34 on), or added_tokens.json with special_tokens_map.json's
`additional_special_tokens` (older slow tokenizers). Their ids follow the WordPiece vocabulary's, in order; a token
that is in the vocabulary already (an `[unused1]` made special) keeps its vocabulary id.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer

FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")


def read_added_tokens(folder: Path, tokenizer_json: dict | None, known: tuple[str, ...]) -> list[dict]:
    """The folder's added tokens but the `known` ones (BERT's five specials, which every tokenizer here matches),
    each {"content", "id", and FLAGS}, from the first of tokenizer.json's `added_tokens` (its parsed data, None
    when the folder has none), tokenizer_config.json's `added_tokens_decoder` and added_tokens.json."""
    if tokenizer_json is not None:
        found = [dict(token) for token in tokenizer_json.get("added_tokens") or []]
    else:
        found = from_config(folder / "tokenizer_config.json") or from_added_tokens_file(folder)
    return [spec(token) for token in found if token["content"] not in known]


def from_config(config_file: Path) -> list[dict]:
    if not config_file.is_file():
        return []
    decoder = json.loads(config_file.read_text(encoding="utf-8")).get("added_tokens_decoder") or {}
    return [{**token, "id": int(token_id)} for token_id, token in decoder.items()]


def from_added_tokens_file(folder: Path) -> list[dict]:
    """added_tokens.json ({content: id}); those special_tokens_map.json names as additional specials are special."""
    added_file, specials_file = folder / "added_tokens.json", folder / "special_tokens_map.json"
    if not added_file.is_file():
        return []
    specials = json.loads(specials_file.read_text(encoding="utf-8")) if specials_file.is_file() else {}
    named = [token if isinstance(token, str) else token.get("content")
             for token in specials.get("additional_special_tokens") or []]
    return [{"content": content, "id": token_id, "special": content in named}
            for content, token_id in json.loads(added_file.read_text(encoding="utf-8")).items()]


def spec(token: dict) -> dict:
    """One added token with every flag: transformers' defaults where a file leaves one out (a special token is
    matched as written, any other after the text is normalised, e.g. lower-cased)."""
    special = bool(token.get("special", False))
    defaults = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": not special, "special": special}
    return {"content": token["content"], "id": int(token["id"]),
            **{flag: bool(token.get(flag, default)) for flag, default in defaults.items()}}


def checked_added_tokens(vocab: dict[str, int], added: list[dict]) -> list[dict]:
    """`added` with each token's id settled: a token in `vocab` keeps its vocabulary id (as the engine gives it);
    the others must take the ids after the vocabulary's, in order. Raises ValueError otherwise."""
    settled, next_id = [], len(vocab)
    for token in sorted(added, key=lambda t: t["id"]):
        if token["content"] in vocab:
            settled.append({**token, "id": vocab[token["content"]]})
            continue
        if token["id"] != next_id:
            raise ValueError(f"added token {token['content']!r} has id {token['id']}, but the vocabulary's "
                             f"{len(vocab)} tokens and the added tokens before it give the next id {next_id}; "
                             "the tokenizer files disagree: save the tokenizer again with transformers")
        settled.append(token)
        next_id += 1
    return settled


def add_to_engine(engine: Tokenizer, added: list[dict]) -> None:
    """Give the engine the added tokens, in id order, so it matches them before WordPiece (raises ValueError when
    the engine would number one otherwise: its ids must be the files')."""
    for token in added:
        flags = {flag: token[flag] for flag in FLAGS}
        adding = engine.add_special_tokens if token["special"] else engine.add_tokens
        adding([AddedToken(token["content"], **flags)])
        if engine.token_to_id(token["content"]) != token["id"]:
            raise ValueError(f"added token {token['content']!r} got id {engine.token_to_id(token['content'])} "
                             f"instead of its {token['id']}")


def config_entries(added: list[dict]) -> dict:
    """tokenizer_config.json's `added_tokens_decoder` entries for the added tokens, keyed by id as transformers
    writes them."""
    return {str(token["id"]): {"content": token["content"], **{flag: token[flag] for flag in FLAGS}}
            for token in added}
