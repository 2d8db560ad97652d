"""What a run leaves in DIR besides its report: DIR/model (a sentence-transformers folder with its card) and
DIR/index (a `bertforge search` index of the corpus); and the check, made before the first stage, that the index
can be built at all (FAISS is an optional extra, and a run that trained for minutes must not stop at its end)."""
from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from ..atomic import published_folder
from ..search.documents import write_passages_file
from ..tasks.retrieval.bi_encoder import BiEncoder
from .card import write_card

if TYPE_CHECKING:
    from .pipeline import Run


def require_index_library() -> None:
    """BertforgeError saying how to install FAISS where it is missing (search.ann's own message)."""
    from ..search import ann  # noqa: F401 (importing it is the check)


def write_model(run: Run, final: dict, report: dict) -> None:
    """DIR/model: the final stage's folder (or the base as a sentence-transformers folder), versions and card."""
    target = run.output / "model"
    with published_folder(target, existing="replace") as model:  # this command's own output: replaced whole
        if final["name"] == "base":
            BiEncoder.from_pretrained(run.base_folder).save_pretrained(model, tokenizer=run.tokenizer)
        else:
            shutil.copytree(run.output / "stages" / f"{final['name']}-{final['key']}" / "model", model,
                            dirs_exist_ok=True)
        write_card(model, report)


def build_corpus_index(run: Run, dense_weight: float, sentence_weight: float = 0.0,
                       neighbour_weight: float = 0.0) -> None:
    """DIR/index: every passage (whole, as read) embedded by DIR/model, a `bertforge search` index that ranks
    by the model's cosines, each passage's best sentence mixed in at `sentence_weight` (0: none; its sentences are
    embedded too), fused with BM25 at `dense_weight` (1: the model alone), each passage's best neighbour in its
    document mixed in at `neighbour_weight` (0: none; which passages follow which is in passages.jsonl)."""
    from ..search.build import build_index

    passages = run.output / "passages.jsonl"
    write_passages_file(run.corpus.passages, passages)
    index = run.output / "index"
    shutil.rmtree(index, ignore_errors=True)
    shutil.rmtree(index.with_name("index.partial"), ignore_errors=True)
    build_index(passages, index, model=run.output / "model", dense_weight=dense_weight,
                sentence_weight=sentence_weight or None, neighbour_weight=neighbour_weight or None)
