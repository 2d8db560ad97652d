"""How the base model's vocabulary fragments the corpus: word pieces per word, share of words split, the
most-split frequent words (the tokenizer comparison of the seed papers: a domain's terms that come
out as five pieces are what a domain vocabulary, or more training, would fix).
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

WORD = re.compile(r"\w+(?:[-']\w+)*")


@dataclass
class Fragmentation:
    words: int  # running words
    distinct: int
    pieces_per_word: float  # word pieces per running word
    split_share: float  # share of running words cut into two or more pieces
    most_split: list[dict] = field(default_factory=list)  # [{"word", "count", "pieces": [...]}]

    def to_json(self) -> dict:
        return {"words": self.words, "distinct_words": self.distinct, "pieces_per_word": self.pieces_per_word,
                "split_share": self.split_share, "most_split": self.most_split}


def fragmentation(texts: Iterable[str], tokenizer, top: int = 15, min_count: int = 3) -> Fragmentation:
    """Counts over the corpus's words (each distinct word tokenized once); most_split: the `top` words seen
    at least min_count times with the most pieces, ties by frequency, numbers left out (`is_term`)."""
    return counted_fragmentation(word_counts(texts), tokenizer, top, min_count)


def word_counts(texts: Iterable[str]) -> Counter:
    """How often each word occurs in `texts` (read once: they may stream from a file)."""
    return Counter(word for text in texts for word in WORD.findall(text))


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
    """Whether a word can stand in the most-split table: mostly letters. A number or a hex address
    (0x0000000000630ce2) is cut into many pieces by any vocabulary and would crowd out the domain's terms
    (PyArg_ParseTuple, rheumatologist), which a domain vocabulary or more training can do something about."""
    return 2 * sum(character.isdigit() for character in word) <= len(word)


def fragmentation_table(report: Fragmentation) -> str:
    """A markdown table of the most-split words, after one line of totals."""
    lines = [f"{report.words:,} words ({report.distinct:,} distinct): {report.pieces_per_word:.2f} word pieces per "
             f"word, {report.split_share:.1%} of words split into several pieces", "",
             "| word | count | pieces |", "|---|---:|---|"]
    lines += [f"| {row['word']} | {row['count']} | {' '.join(row['pieces'])} |" for row in report.most_split]
    return "\n".join(lines)
