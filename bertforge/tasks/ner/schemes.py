"""Which entity tag scheme a set of tags uses, decided once for reading files and for scoring them.

seqeval's default (conlleval) mode knows the prefixes B, I, E and S: it scores IOB1, IOB2, IOE and
IOBES as transformers' run_ner.py does. It reads BILOU's L- and U- as I-, merging single-word and
last-word entities into their neighbours, so BILOU is scored in seqeval's strict BILOU mode.
"""
import re
from collections.abc import Iterable
from typing import Any

# Each scheme's own prefixes; O, B- and I- are shared by all of them.
SCHEME_PREFIXES = {"L-": "BILOU", "U-": "BILOU", "E-": "IOBES", "S-": "IOBES"}
ENTITY_TAG = re.compile(r"O|[BI" + "".join(prefix[0] for prefix in SCHEME_PREFIXES) + r"]-\S+")


def scheme_of_tag(tag: str) -> str | None:
    """"BILOU" for an L-/U- tag, "IOBES" for an E-/S- tag (IOE's too), None for O, B- and I- (any scheme)."""
    return SCHEME_PREFIXES.get(tag[:2])


def schemes_used(tagged: Iterable[tuple[str, Any]]) -> dict[str, tuple[str, Any]]:
    """{scheme: (its first tag, where that tag was)} over (tag, where) pairs, for the tags only one scheme has
    (L-/U-, E-/S-): more than one key is a mix no seqeval mode scores."""
    first = {}
    for tag, where in tagged:
        scheme = scheme_of_tag(tag)
        if scheme is not None:
            first.setdefault(scheme, (tag, where))
    return first


def scored_as_bilou(tags: Iterable[str]) -> bool:
    """Whether tags are scored in seqeval's strict BILOU mode (they use L-/U-) rather than its default mode.

    Raises ValueError when L-/U- and E-/S- tags are mixed: no seqeval mode scores both.
    """
    first = schemes_used((tag, None) for tag in tags)
    if len(first) > 1:
        raise ValueError(f"the tags mix BILOU ({first['BILOU'][0]!r}) and IOBES ({first['IOBES'][0]!r}); "
                         "convert them to one scheme")
    return "BILOU" in first


def seqeval_scoring(tags: Iterable[str]) -> dict:
    """seqeval's keyword arguments for scoring these tags: strict BILOU, or {} for its default mode."""
    if not scored_as_bilou(tags):
        return {}
    from seqeval.scheme import BILOU  # imported here: reading files needs no seqeval

    return {"mode": "strict", "scheme": BILOU}
