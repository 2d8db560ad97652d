"""Entity tag schemes: BILOU scored strictly, IOB/IOBES in conlleval's mode, mixed schemes refused."""
from types import SimpleNamespace

import pytest

from bertforge.tasks import TaskSettings
from bertforge.tasks.metrics import ner_metrics, ner_report
from bertforge.tasks.ner.conll import ENTITY_TAG, check_entity_tags, read_conll
from bertforge.tasks.ner.task import NerTask

# Gold: PER, PER, LOC (2 words), LOC; predicted: PER (2 words), LOC (3 words). No entity matches.
BILOU_GOLD = [["U-PER", "U-PER", "O", "B-LOC", "L-LOC", "U-LOC"]]
BILOU_PREDICTED = [["B-PER", "L-PER", "O", "B-LOC", "I-LOC", "I-LOC"]]


def test_bilou_is_scored_strictly():
    # conlleval's mode reads L-/U- as I- and finds PER(0-1), LOC(3-5) on both sides: F1 1.0 before the fix.
    results = ner_metrics(BILOU_GOLD, BILOU_PREDICTED)
    assert results["f1"] == 0.0 and results["precision"] == 0.0 and results["recall"] == 0.0
    assert ner_metrics(BILOU_GOLD, BILOU_GOLD)["f1"] == 1.0
    # The first PER and the last LOC right; strict mode drops B-LOC I-LOC (no L-), so 2 of 2 predicted, 2 of 4 gold.
    half = [["U-PER", "O", "O", "B-LOC", "I-LOC", "U-LOC"]]
    assert ner_metrics(BILOU_GOLD, half)["precision"] == 1.0 and ner_metrics(BILOU_GOLD, half)["recall"] == 0.5
    assert ner_report(BILOU_GOLD, BILOU_PREDICTED)["PER"]["support"] == 2.0


def test_iob_and_iobes_keep_conlleval_mode():
    # conlleval's leniency stays for the schemes it knows: I- after O starts an entity, S- equals a lone B-.
    assert ner_metrics([["I-PER", "O"]], [["B-PER", "O"]])["f1"] == 1.0
    assert ner_metrics([["S-PER", "O", "B-LOC", "E-LOC"]], [["B-PER", "O", "B-LOC", "I-LOC"]])["f1"] == 1.0


def test_mixed_schemes_are_refused():
    with pytest.raises(ValueError, match=r"mix BILOU \('U-PER'\) and IOBES \('S-PER'\)"):
        ner_metrics([["U-PER", "O"]], [["S-PER", "O"]])
    assert all(ENTITY_TAG.fullmatch(tag) for tag in ("O", "B-X", "I-X", "E-X", "S-X", "L-X", "U-X"))
    assert not any(ENTITY_TAG.fullmatch(tag) for tag in ("X-PER", "B-", "word"))


def test_a_file_mixing_schemes_names_both_lines(tmp_path):
    path = tmp_path / "mixed.conll"
    path.write_text("Ann\tU-PER\nsaid\tO\n\nNew\tB-LOC\nYork\tE-LOC\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 1 has the BILOU tag 'U-PER' but the one at line 4 has the IOBES "
                                         r"tag 'E-LOC'; convert the file to one tag scheme"):
        check_entity_tags(read_conll(path), path)


def test_evaluate_refuses_a_file_in_another_scheme_before_predicting(tmp_path):
    path = tmp_path / "dev.conll"
    path.write_text("Ann\tS-PER\nsaid\tO\n", encoding="utf-8")
    task = NerTask(TaskSettings(dev=str(path)), tokenizer=None, config=SimpleNamespace(id2label={0: "O", 1: "U-PER"}))
    with pytest.raises(ValueError, match="dev.conll and the model's labels: the tags mix BILOU"):
        task.evaluate(model=None, split="dev")  # no model needed: refused before predicting
