"""`readmission score` reads an admission's notes as `prepare` does (joined, cleaned, then chunked) and says in
words when the notes so far give no risk yet."""
import numpy as np
import pytest

from bertforge import BertTokenizer
from bertforge.readmission import admission_chunks
from bertforge.readmission.baselines import admission_scores
from bertforge.readmission.recipe import admission_risk
from test_window_combination import FirstPieceClassifier


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return BertTokenizer.from_pretrained(minilm_dir)


def test_short_notes_and_tails_are_read_with_the_next_note():
    """Each note was chunked alone: a note's last <= 10 words, and a note of <= 10 words, were dropped."""
    assert admission_chunks(["One two three four five six", "seven eight nine ten eleven twelve"]) == [
        "one two three four five six seven eight nine ten eleven twelve"]
    sizes = [len(chunk.split()) for chunk in admission_chunks(["w " * 325, "Nursing: pt resting, no events."])]
    assert sizes == [318, 12]  # 7 + 5 words past the first chunk: each note's own tail was too short


def test_score_rechunks_the_notes_so_far_as_prepare_would(tokenizer):
    # The stub scores a chunk by its first word: "one" 0.9, "four" 0.2, "seven" 0.1, anything else 0.5.
    model = FirstPieceClassifier(dict(zip(tokenizer.convert_tokens_to_ids(["one", "four", "seven"]), [0.9, 0.2, 0.1])))
    notes = ["One two three",  # 3 words: no chunk yet
             " ".join(["five"] * 315 + ["four"] + ["five"] * 14),  # joined: chunks start at "one" and "four"
             " ".join(["five"] * 303 + ["seven"] + ["five"] * 16)]  # a third chunk starts at "seven"
    assert [chunk.split()[0] for chunk in admission_chunks(notes)] == ["one", "four", "seven"]
    trace = admission_risk(model, tokenizer, notes, max_length=8)
    np.testing.assert_allclose(trace.chunk_probabilities, [0.9, 0.2, 0.1], atol=1e-6)
    # After note 2: (0.9 + 0.55 * 2/2) / (1 + 2/2); after note 3, ClinicalBERT's worked example, 0.6, as
    # `readmission evaluate` scores prepare's chunks of this admission. Each note chunked alone gave 0.5.
    assert trace.risks[0] is None
    np.testing.assert_allclose(trace.risks[1:], [0.725, admission_scores([1, 1, 1], [0.9, 0.2, 0.1])[1][0]],
                               atol=1e-6)
    assert trace.top_chunk == admission_chunks(notes)[0]
    lines = trace.lines(["a.txt", "b.txt", "c.txt"])
    assert lines[0] == ("after a.txt: no risk yet: the notes so far have at most 10 words after cleaning, "
                        "and a chunk needs 11")
    assert lines[1:3] == ["after b.txt: risk 0.725", "after c.txt: risk 0.600"]
    assert lines[3].startswith("highest-scoring chunk (0.900): one two three five")
    # Two short notes together make a chunk: the per-note chunking refused them ("nothing to score").
    assert admission_risk(model, tokenizer, ["one two three four five six", "seven eight nine ten eleven"],
                          max_length=8).risks == [None, pytest.approx(0.9)]
