"""How the base model's vocabulary fragments the corpus: word pieces per word, share of words split, the
most-split frequent words (the tokenizer comparison of the seed papers: a domain's terms that come
out as five pieces are what a domain vocabulary, or more training, would fix).

A word is one the tokenizer itself cuts the text into before WordPiece (its normaliser, then its pre-tokenizer:
whitespace, and every punctuation and CJK character a word of its own), so the pieces counted are the pieces the
model reads. A rule of our own (a regex that kept "Knightley's" and "sister-in-law" whole) counted as split words
that no vocabulary can join: BERT always cuts at ' and - (Emma's first 6,000 lines: 4.9% of 59,497 words split by
the regex, 3.1% of the tokenizer's 73,245; a fifth of the regex's split words held ' or -).
"""
from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..tokenization.vocab_training import build_normalizer, build_pre_tokenizer, engine_text, reading_settings


@dataclass
class Fragmentation:
    words: int  # running words, as the tokenizer pre-tokenizes the text (punctuation marks are words)
    distinct: int
    pieces_per_word: float  # word pieces per running word
    split_share: float  # share of running words cut into two or more pieces
    most_split: list[dict] = field(default_factory=list)  # [{"word", "count", "pieces": [...]}]

    def to_json(self) -> dict:
        return {"words": self.words, "distinct_words": self.distinct, "pieces_per_word": self.pieces_per_word,
                "split_share": self.split_share, "most_split": self.most_split}


def fragmentation(texts: Iterable[str], tokenizer, top: int = 15, min_count: int = 3) -> Fragmentation:
    """Counts over the corpus's words as `tokenizer` pre-tokenizes them (each distinct word tokenized once);
    most_split: the `top` words seen at least min_count times with the most pieces, ties by frequency, numbers,
    hashes and keys left out (`is_term`)."""
    return counted_fragmentation(word_counts(texts, tokenizer), tokenizer, top, min_count)


def word_counts(texts: Iterable[str], tokenizer=None) -> Counter:
    """How often each word occurs in `texts` (read once: they may stream from a file), a word being what
    `tokenizer` (a BertTokenizer) cuts the text into before WordPiece, normalised as it normalises (lower-cased
    for an uncased one). Without a tokenizer: BERT's pre-tokenization with the case kept, the same running words
    as any BertTokenizer's (one that splits CJK characters), each still tokenized to the same pieces."""
    split = pre_tokenized_words(*tokenizer_settings(tokenizer))
    return Counter(word for text in texts for word in split(text))


def tokenizer_settings(tokenizer) -> tuple[bool, bool | None, bool]:
    """(lower-casing, accent stripping, CJK splitting) of a BertTokenizer; without one, case and accents kept."""
    if tokenizer is None:
        return False, False, True
    return tuple(reading_settings(tokenizer).values())  # in READING_SETTINGS' order: pre_tokenized_words' own


@functools.cache
def pre_tokenized_words(lowercase: bool, strip_accents: bool | None, chinese_chars: bool
                        ) -> Callable[[str], list[str]]:
    """text -> its words: the normaliser and pre-tokenizer a BertTokenizer with these settings is built with
    (tokenization/vocab_training.build_engine), so the words are the tokenizer's own."""
    normalizer, pre_tokenizer = build_normalizer(lowercase, strip_accents), build_pre_tokenizer(chinese_chars)

    def words(text: str) -> list[str]:
        return [word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(engine_text(
            text, lowercase)))]

    return words


def counted_fragmentation(counts: Counter, tokenizer, top: int = 15, min_count: int = 3) -> Fragmentation:
    """`fragmentation` of the words `word_counts` counted."""
    if not counts:
        return Fragmentation(0, 0, 0.0, 0.0)
    pieces = {word: tokenizer.tokenize(word) for word in counts}
    total = sum(counts.values())
    piece_count = sum(len(pieces[w]) * n for w, n in counts.items())
    split = sum(n for w, n in counts.items() if len(pieces[w]) > 1)
    frequent = [w for w, n in counts.items() if n >= min_count and len(pieces[w]) > 1 and is_term(w)]
    frequent.sort(key=lambda w: (-len(pieces[w]), -counts[w], w))
    most_split = [{"word": w, "count": counts[w], "pieces": pieces[w]} for w in frequent[:top]]
    return Fragmentation(total, len(counts), piece_count / total, split / total, most_split)


def is_term(word: str) -> bool:
    """Whether a word can stand in the most-split table: mostly letters, and not a hash or a key. A number, a hex
    address (0x0000000000630ce2), a commit id (a34a7b00f22f...) or a base64 key is cut into many pieces by any
    vocabulary and would crowd out the domain's terms (parsetuple, rheumatologist), which a domain vocabulary or
    more training can do something about: a package's docs (/usr/share/doc) filled the table with commit ids."""
    digits = sum(character.isdigit() for character in word)
    if 2 * digits > len(word):
        return False
    if digits and len(word) >= HEX_RUN and all(character in HEX_DIGITS for character in word.lower()):
        return False
    return not (digits and len(word) >= KEY_LENGTH)  # letters and digits run together that long: a key or a token


HEX_DIGITS = frozenset("0123456789abcdef")
HEX_RUN = 8  # a hex string this long with a digit in it is an id (a short commit id has 7, most 8 or more)
KEY_LENGTH = 24  # a word of letters and digits this long is a key (utf8mb4, sha256sum, python3 are short)


def fragmentation_table(report: Fragmentation) -> str:
    """A markdown table of the most-split words, after one line of totals."""
    lines = [f"{report.words:,} words ({report.distinct:,} distinct): {report.pieces_per_word:.2f} word pieces per "
             f"word, {report.split_share:.1%} of words split into several pieces", "",
             "| word | count | pieces |", "|---|---:|---|"]
    lines += [f"| {row['word']} | {row['count']} | {' '.join(row['pieces'])} |" for row in report.most_split]
    return "\n".join(lines)
