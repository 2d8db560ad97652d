"""QA input that cannot be read whole is said: questions cut to max_query_length (one warning per call), and a
context of characters the tokenizer drops is skipped as an empty one is."""
import json
import logging

import pytest

from bertforge import BertTokenizer
from bertforge.tasks.qa.features import qa_features
from bertforge.tasks.qa.squad import QAExample, is_blank, read_squad


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return BertTokenizer.from_pretrained(minilm_dir)


def test_questions_cut_to_max_query_length_give_one_warning(tokenizer, caplog):
    examples = [QAExample(id=str(i), question=question, context="a b c")
                for i, question in enumerate(["which " * 10, "which " * 5, "who"])]
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        features = qa_features(tokenizer, examples, max_length=32, doc_stride=8, max_query_length=5, training=False)
    assert [ids.count(tokenizer.convert_tokens_to_ids("which")) for ids in features.input_ids] == [5, 5, 0]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "1 of 3 questions were cut to their first 5 tokens (max_query_length); the rest of each was not read"]


@pytest.mark.parametrize("context", ["\u200b\u00ad\u200b", "\ufeff \u200d\n", "\ufffd"])
def test_a_context_with_no_tokens_is_skipped_as_an_empty_one(tokenizer, tmp_path, context):
    """It was answered with "" and no word about it, while an empty context was skipped with a warning."""
    assert tokenizer(context, add_special_tokens=False)["input_ids"] == []  # what is_blank stands for
    assert is_blank(context) and is_blank(" \t") and not is_blank("\u200ba")
    qas = [{"id": "z", "question": "What?", "answers": []}]
    paragraphs = [{"context": context, "qas": qas}, {"context": "  ", "qas": [{**qas[0], "id": "e"}]}]
    data = {"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}
    path = tmp_path / "notok.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    examples = read_squad(path, training=False)
    assert list(examples) == []
    assert examples.problems == [
        "data[0].paragraphs[0].qas[0] (id 'z'): empty context (only characters the tokenizer drops, e.g. zero-width "
        "spaces); example skipped",
        "data[0].paragraphs[1].qas[0] (id 'e'): empty context; example skipped"]
