"""A word in a sentence: where it occurs and which word pieces are its own.

One rule for `Embedder.word_vector`, `bertforge senses` and the explorer's word in context: a word
(or a phrase) matches as a whole word, ignoring case, every match counts; its pieces are the tokens
whose character offsets overlap the match. Nothing here needs torch or scikit-learn, so the server
can import it when it starts.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class Occurrence:
    sentence: str
    start: int   # character span of the word in the sentence
    end: int

    def context(self, width: int = 60) -> str:
        """The sentence around the word, the word in [brackets], cut to `width` characters a side."""
        left = self.sentence[max(0, self.start - width):self.start]
        right = self.sentence[self.end:self.end + width]
        left = ("..." + left) if self.start > width else left
        right = (right + "...") if self.end + width < len(self.sentence) else right
        return f"{left}[{self.sentence[self.start:self.end]}]{right}"


def word_pattern(word: str) -> re.Pattern:
    """A whole-word, case-insensitive match of word (or a phrase, any whitespace between its words).

    Whole words: "bank" is not found inside "banking". Raises ValueError for an empty or non-str word.
    """
    if not isinstance(word, str) or not word.strip():
        raise ValueError(f"word={word!r} must be a non-empty str")
    return re.compile(r"(?<!\w)" + r"\s+".join(map(re.escape, word.split())) + r"(?!\w)", re.IGNORECASE)


def find_occurrences(sentences: Iterable[str], word: str) -> list[Occurrence]:
    """Every whole-word match of word in the sentences, in order (a sentence may give several)."""
    pattern = word_pattern(word)
    return [Occurrence(sentence, *match.span()) for sentence in sentences for match in pattern.finditer(sentence)]


def find_word(sentence: str, word: str, occurrence: int) -> tuple[int, int]:
    """Character span [start, end) of the chosen match of word (0 the first, -1 the last).

    Raises ValueError when the word does not occur or `occurrence` is out of range.
    """
    matches = find_occurrences([sentence], word)
    if not matches:
        raise ValueError(f"{word.strip()!r} is not in the sentence {sentence!r} (matched as a whole word, "
                         "ignoring case)")
    if not isinstance(occurrence, int) or not -len(matches) <= occurrence < len(matches):
        raise ValueError(f"occurrence={occurrence!r} is out of range: {word.strip()!r} occurs {len(matches)} time(s) "
                         f"in the sentence (use 0 to {len(matches) - 1}, or -1 for the last)")
    chosen = matches[occurrence]
    return chosen.start, chosen.end


def word_pieces(offsets: Sequence[Sequence[int]], start: int, end: int) -> list[int] | None:
    """Positions of the tokens whose character offsets overlap [start, end): the word's pieces.

    offsets: one (start, end) per token, (0, 0) for [CLS], [SEP] and padding. None when truncation
    cut the word off, even partly: a vector of some of its pieces would not be the word's.
    """
    pieces = [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start]
    if not pieces or offsets[pieces[-1]][1] < end:
        return None
    return pieces


def spans_pieces(sentence: str, offsets: Sequence[Sequence[int]], spans: Sequence[tuple[int, int]],
                 max_length: int, position_limit: int) -> list[list[int]]:
    """Per character span of the sentence, its pieces (`word_pieces`) among the tokens of `offsets`.

    Raises ValueError for a span that truncation at max_length cut off, naming the fix.
    """
    found = [word_pieces(offsets, start, end) for start, end in spans]
    for (start, end), pieces in zip(spans, found):
        if pieces is None:
            raise ValueError(f"{sentence[start:end]!r} (characters {start}-{end}) falls past the truncation at "
                             f"max_length={max_length} tokens; pass a larger max_length (this model takes up to "
                             f"{position_limit}) or a shorter sentence")
    return found
