"""Text that is cut to the model's length without windows is said at the command line: one warning per call."""
import logging

import pytest

from bertforge import BertTokenizer
from bertforge.tasks.classification.windows import encode_windows

NUMBERS = "one two three four five six seven eight nine ten".split()  # one word piece each


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return BertTokenizer.from_pretrained(minilm_dir)


def warnings_of(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]


def test_cut_pairs_and_capped_texts_give_one_warning_line_with_the_counts(tokenizer, caplog):
    """They were logged at INFO, which the CLI (logging at WARNING) never shows."""
    long_text = " ".join(NUMBERS)
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        pairs = encode_windows(tokenizer, [(long_text, "one two"), (long_text, long_text), ("a", "b")], max_length=12)
    assert pairs.truncated_pairs == 2
    assert warnings_of(caplog) == ["2 of 3 text pairs were cut to 12 ids, the longer text first; "
                                   "the rest of those texts was not read"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        capped = encode_windows(tokenizer, [(long_text,), (long_text,), ("short",)], max_length=6, stride=0,
                                max_windows=1)
    assert capped.capped_documents == 2
    assert warnings_of(caplog) == ["2 of 3 texts were cut to their first 1 window(s) of 6 ids (max_windows=1); "
                                   "the rest of those texts was not read"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        encode_windows(tokenizer, [(long_text,), ("a", )], max_length=6, stride=0)  # every window kept: nothing cut
    assert warnings_of(caplog) == []
