"""A request's inputs -> token ids the models take, checked as text-embeddings-inference checks them.

An input is a text, or (OpenAI's and TEI's other form) a list of the model's own token ids, with
[CLS]/[SEP] around them as /tokenize and `tokenizer(text)` give them (taken as they are, as TEI takes
them) or without, as `tokenizer(text, add_special_tokens=False)` gives them (the server adds them);
either way truncated as text is. An empty input is
400 (TEI's `Empty`); more tokens than --max-input-length is 422 (TEI's validation error) unless the request asks to
truncate (`"truncate": true`) or the server was started with --auto-truncate. A prompt
(`prompt_name`, else the server's default prompt) is put in front of each text, as
sentence-transformers' `encode(prompt_name=...)` does.

Runs on the tokenizer thread (see `server.Server.tokenized`): one tokenizer instance, one thread.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

from ..models.folder import ModelFolder, check_prompt_pooled
from ..tokenization.tokenizer import BertTokenizer
from .errors import ApiError
from .passes import Tokens

Direction = Literal["right", "left", "Right", "Left"]
Input = str | list[int]


@dataclass(frozen=True)
class Prompts:
    """The prompts a request may name, and the one used when it names none (text, not a name)."""

    named: dict[str, str] = field(default_factory=dict)
    default: str = ""
    model: str = ""  # whose prompts they are (the embedding model's folder), for the 422 message
    folder: ModelFolder | None = None  # the embedding model's, whose Pooling may leave prompts out (422 then)

    def prefix(self, prompt_name: str | None) -> str:
        if prompt_name is None:
            return self.default
        if prompt_name not in self.named:
            known = ", ".join(self.named) or "none (serve a sentence-transformers folder that has prompts)"
            whose = f"the model {self.model}'s" if self.model else "this server's"
            raise ApiError(422, "validation", f"prompt_name {prompt_name!r} is not one of {whose} prompts: {known}")
        if self.folder is not None:
            try:
                check_prompt_pooled(self.folder, self.named[prompt_name], f"prompt_name {prompt_name!r}")
            except ValueError as error:
                raise ApiError(422, "validation", str(error)) from None
        return self.named[prompt_name]


def which(index: int, count: int) -> str:
    return "the input" if count == 1 else f"input {index}"


def as_list(inputs: Input | list[Input], field_name: str, limit: int, empty_items: bool = False) -> list[Input]:
    """One input or a list of them -> a list; 400 when empty (or an input is, unless `empty_items`), 422 over
    --max-client-batch-size."""
    items = [inputs] if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)) else list(inputs)
    if not items:
        raise ApiError(400, "empty", f"`{field_name}` is an empty list; send at least one input")
    if len(items) > limit:
        raise ApiError(422, "validation", f"`{field_name}` has {len(items)} inputs, more than the server's limit of "
                                          f"{limit} per request (--max-client-batch-size); split it into requests")
    for index, item in enumerate(items):
        if len(item) == 0 and not empty_items:
            raise ApiError(400, "empty", f"{which(index, len(items))} of `{field_name}` is empty; TEI and this "
                                         "server refuse empty inputs: send text (or token ids)")
    return items


class InputEncoder:
    """Tokenizes requests' inputs for one model and enforces its length limit."""

    def __init__(self, tokenizer: BertTokenizer, max_input_length: int, auto_truncate: bool, prompts: Prompts):
        self.tokenizer = tokenizer
        self.max_input_length = max_input_length
        self.auto_truncate = auto_truncate
        self.prompts = prompts

    def encode(self, inputs: Sequence[Input], truncate: bool | None = None, direction: Direction = "right",
               prompt_name: str | None = None) -> list[Tokens]:
        """Token ids with [CLS] and [SEP], one Tokens per input, within max_input_length."""
        prefix = self.prompts.prefix(prompt_name)
        texts = [(i, prefix + item) for i, item in enumerate(inputs) if isinstance(item, str)]
        id_lists: list[list[int]] = [[] for _ in inputs]
        if texts:
            for (i, _), ids in zip(texts, self.tokenizer([text for _, text in texts])["input_ids"]):
                id_lists[i] = ids
        prompt_ids = self.tokenizer(prefix, add_special_tokens=False)["input_ids"] if prefix else []
        for i, item in enumerate(inputs):
            if not isinstance(item, str):
                id_lists[i] = self.with_specials(prompt_ids + self.inner_ids(self.checked_ids(item, i, len(inputs))))
        cut = self.cuts(truncate)
        return [Tokens(self.fitted(ids, i, len(inputs), cut, direction.lower())) for i, ids in enumerate(id_lists)]

    def encode_pairs(self, pairs: Sequence[tuple[str, str]], truncate: bool | None = None,
                     direction: Direction = "right") -> list[Tokens]:
        """(first, second) pairs -> [CLS] first [SEP] second [SEP] with segment ids; truncated longest first, from
        the `direction` end of the longer text, as TEI passes truncation_direction to its tokenizer for a pair."""
        cut = self.cuts(truncate)
        firsts, seconds = [a for a, _ in pairs], [b for _, b in pairs]
        self.tokenizer.truncation_side = direction.lower()
        try:
            encoded = self.tokenizer(firsts, seconds, truncation="longest_first" if cut else False,
                                     max_length=self.max_input_length if cut else None)
        finally:
            self.tokenizer.truncation_side = "right"
        tokens = [Tokens(ids, types) for ids, types in zip(encoded["input_ids"], encoded["token_type_ids"])]
        for index, item in enumerate(tokens):
            self.fitted(item.ids, index, len(tokens), False, "right")  # raises when too long
        return tokens

    def cuts(self, truncate: bool | None) -> bool:
        """Whether an input over the limit is cut: the request's `truncate`, else the server's --auto-truncate."""
        return self.auto_truncate if truncate is None else truncate

    def checked_ids(self, ids: list[int], index: int, count: int) -> list[int]:
        size = self.tokenizer.vocab_size
        bad = next((token for token in ids if not 0 <= token < size), None)
        if bad is not None:
            raise ApiError(422, "validation", f"{which(index, count)} holds token id {bad}, outside this model's "
                                              f"vocabulary of {size} (0 to {size - 1})")
        return list(ids)

    def with_specials(self, ids: list[int]) -> list[int]:
        return [self.tokenizer.cls_token_id, *ids, self.tokenizer.sep_token_id]

    def inner_ids(self, ids: list[int]) -> list[int]:
        """A text's ids without the [CLS] ... [SEP] around them, when sent with them: as /tokenize and a tokenizer
        give ids by default, and as TEI takes them (the model then reads [CLS] and [SEP] once, not twice: cosine
        0.958 to the text's vector before); ids sent without them are the text's as they are."""
        if len(ids) >= 2 and ids[0] == self.tokenizer.cls_token_id and ids[-1] == self.tokenizer.sep_token_id:
            return ids[1:-1]
        return ids

    def fitted(self, ids: list[int], index: int, count: int, truncate: bool, direction: str) -> list[int]:
        """ids within max_input_length: cut on the right or the left keeping [CLS] and [SEP], or 422."""
        limit = self.max_input_length
        if len(ids) <= limit:
            return ids
        if not truncate:
            raise too_long(len(ids), limit, which(index, count))
        if direction == "left":
            return ids[:1] + ids[len(ids) - limit + 1:]
        return ids[:limit - 1] + ids[-1:]


def too_long(length: int, limit: int, what: str) -> ApiError:
    """TEI's 422 (a validation error, since TEI 1.9) for an input over the limit the request did not ask to cut."""
    return ApiError(422, "validation", f"{what} has {length} tokens, more than the server's limit of {limit} "
                                       f"(--max-input-length); shorten it, send \"truncate\": true to cut it to "
                                       f"{limit}, or start the server with --auto-truncate")
