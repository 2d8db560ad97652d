"""How adapt reads a corpus, and what the corpus must give to be adapted to: enough passages, passages of sentences,
and held-out queries to pick a model by and report it. Each failure is one line saying what to do, before the output
folder is claimed."""
from __future__ import annotations

from collections.abc import Sequence

from ..errors import UsageError
from ..search.documents import MAX_WORDS, Corpus, no_text_found, read_corpus
from ..search.token_limit import TokenLimit
from .ict import MIN_QUERY_WORDS, MIN_SENTENCES, HeldOut, training_passages

MIN_PASSAGES = 20  # fewer and the held-out queries are a handful: the numbers would be noise


def read_adapt_corpus(paths: Sequence[str], tokenizer, max_length: int, text_column: str = "text",
                      id_column: str | None = None) -> Corpus:
    """The passages adapt trains, scores and indexes: split over MAX_WORDS words, and to fit the base's `max_length`
    in word pieces (its `tokenizer`); the scripts that draw adapt's held-out queries read the corpus here too."""
    return read_corpus(paths, text_column=text_column, max_words=MAX_WORDS, id_column=id_column,
                       max_tokens=TokenLimit(tokenizer, max_length))


def check_corpus(corpus: Corpus, where: str) -> None:
    """One line saying what to do when the corpus (read from `where`) cannot be adapted to."""
    if not corpus.passages:
        raise UsageError(no_text_found(where, not_text=corpus.not_text))
    if len(corpus.passages) < MIN_PASSAGES:
        raise UsageError(f"{where} holds {len(corpus.passages)} passage(s); adapt needs at least {MIN_PASSAGES} "
                         "(separate passages with blank lines, or give more text)")
    if not training_passages(corpus.passages):
        raise UsageError(f"no passage in {where} has two sentences: adapt cuts sentences out of passages, so it "
                         "needs prose with sentence boundaries (full stops), not one phrase per passage")


def check_held_out(held_out: HeldOut, where: str) -> None:
    """One line when the corpus gives too few held-out queries to pick a model by and report it (none: "need at least
    one array to stack"; one: a KeyError 'dev' traceback)."""
    if all(held_out.queries.values()):
        return
    count = sum(len(queries) for queries in held_out.queries.values())
    raise UsageError(f"{where} gives {count} held-out query(ies), and adapt needs 2 at least (one to pick the model, "
                     f"one to report it): a query is a sentence of {MIN_QUERY_WORDS} words or more cut out of a "
                     f"passage of {MIN_SENTENCES} sentences or more; give longer passages (prose with full stops) or "
                     "more text")
