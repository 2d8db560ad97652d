"""A model's length in word pieces as a limit passages are split to fit (`read_corpus`'s max_tokens: adapt's corpus,
and the folder, pages or table `index build` and `index add` read, `of_embedder`): the words-based split alone left
technical passages longer than the model reads."""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .corpus import part_id
from .passage_store import Passage


@dataclass(frozen=True)
class TokenLimit:
    """A model's length in word pieces, [CLS] and [SEP] included: what a passage must fit to be read whole. Technical
    text runs to many pieces a word (Python's docs: 258 of 1,453 passages of at most 150 words were over MiniLM's
    256 tokens, up to 882), and the model reads only the first max_length of them."""

    tokenizer: object
    max_length: int

    @classmethod
    def of_embedder(cls, embedder) -> "TokenLimit":
        """What a passage must fit for `embedder` (an index's: it embeds every passage) to read it whole: its
        max_length, less the pieces of the prompt it puts before every text, which the model reads first
        (`Embedder.token_count` of an empty text: the prompt, [CLS] and [SEP], the last two counted here already). A
        prompt ends where the tokenizer cuts anyway (sentence-transformers' "passage: "), so its pieces and the
        text's add up."""
        prompt = embedder.token_count("") - 2
        return cls(embedder.tokenizer, embedder.max_length - prompt)

    def pieces(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []

    def fits(self, passage: Passage) -> bool:
        return sum(self.pieces([passage.title, *passage.sentences])) + 2 <= self.max_length

    def split(self, passage: Passage) -> list[Passage]:
        """Consecutive runs of whole sentences, each within the limit with the title before it; a sentence longer
        than that (a code listing, a table: text the sentence splitter finds no end in) in runs of whole words."""
        title, *lengths = self.pieces([passage.title, *passage.sentences])
        room = max(1, self.max_length - 2 - title)
        fitting = self.fitting(passage.sentences, lengths, room)
        parts = [[sentence for sentence, _ in run] for run in runs_within(fitting, room)]
        if len(parts) == 1:
            return [passage]
        return [Passage(part_id(passage.id, i), sentences, passage.title) for i, sentences in enumerate(parts)]

    def fitting(self, sentences: list[str], lengths: list[int], room: int) -> Iterator[tuple[str, int]]:
        """(sentence, pieces) for each sentence, one longer than `room` as runs of its words that fit it."""
        for sentence, length in zip(sentences, lengths):
            if length <= room:
                yield sentence, length
                continue
            words = sentence.split()
            for run in runs_within(zip(words, self.pieces(words)), room):
                yield " ".join(word for word, _ in run), sum(pieces for _, pieces in run)


def runs_within(items: Iterable[tuple[str, int]], room: int) -> list[list[tuple[str, int]]]:
    """(text, pieces) items in consecutive runs, each as long as fits in `room` pieces (an item longer than that
    is a run of its own): how a passage's sentences, and a long sentence's words, are packed."""
    runs: list[list[tuple[str, int]]] = [[]]
    used = 0
    for text, pieces in items:
        if runs[-1] and used + pieces > room:
            runs.append([])
            used = 0
        runs[-1].append((text, pieces))
        used += pieces
    return runs
