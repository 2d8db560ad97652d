"""The function behind `bertforge adapt` (see commands.py for how functions become sub-commands)."""
from __future__ import annotations

from typing import Literal


def adapt(corpus: list[str], *, output: str, base: str = "minilm", preset: Literal["quick", "full"] = "quick",
          eval: str | None = None, text_column: str = "text", id_column: str | None = None, seed: int = 0,
          device: Literal["auto", "cpu", "cuda"] = "auto", precision: Literal["auto", "fp32", "bf16"] = "auto",
          mlm: str | None = None, vocab: Literal["base", "new"] = "base",
          vocab_size: int | None = None, minutes: float | None = None, query_generator: str | None = None) -> None:
    """Adapt a sentence encoder to a folder of domain text: train, evaluate, index, in one command.

    Args:
        corpus: text files (passages separated by blank lines), .jsonl (text, optional id/title), .csv/.tsv
            (with --text-column), HTML / Markdown / reStructuredText pages (read as their text), .gz/.xz, or
            folders of them
        output: folder for model/ (sentence-transformers), index/ (bertforge search), report.{json,md,png}
            and the stage cache (run again after a kill: finished stages are kept)
        base: the model to adapt: a sentence-transformers or BERT folder, or minilm
        preset: quick (CPU: ~20 minutes for 150k words) or full (a GPU: longer ICT, then SimCSE)
        eval: a BEIR folder (corpus.jsonl, queries.jsonl, qrels/test.tsv; qrels/dev.tsv where it has no test split) scored beside the held-out queries
        text_column: the column of a .csv/.tsv corpus, or the field of a .jsonl one, that holds the text
        id_column: the column of a .csv/.tsv corpus, or the field of a .jsonl one, that holds each passage's id,
            which the index and the server give back; every row or record must have it (default: FILE:ROW for a
            table; a record's id or _id, else FILE:LINE)
        seed: seed for the held-out queries and the training order
        device: where to train: auto (the GPU when there is one), cpu or cuda
        precision: training's number format: auto (bf16 autocast on a CPU with AMX and on a GPU for models of
            BERT-base width and up, else fp32), fp32 or bf16. Like --device, it does not make finished stages run again
        mlm: a BERT checkpoint with an MLM head to continue-pretrain on the corpus first; the later stages train
            its encoder (pooled as --base pools). Without it, a --base with an MLM head is continue-pretrained;
            off skips continued MLM
        vocab: base (the MLM checkpoint's vocabulary) or new (grown by pieces learnt on the corpus, each new
            piece's embedding the mean of its old pieces')
        vocab_size: with --vocab new, the size of the WordPiece vocabulary learnt on the corpus, whose pieces
            the base lacks are added (8000 when left out)
        minutes: the time the whole run should take, which sizes the training stages: fewer epochs when a
            training step timed on this machine says the preset's would not fit (default: 20 for quick, none for
            full)
        query_generator: a doc2query model (a transformers T5 folder or hub name, e.g. doc2query/msmarco-t5-base-v1)
            whose queries for the passages join ICT's anchors (GPL-style; needs pip install 'bertforge[generate]')
    """
    from ..adapt.pipeline import AdaptOptions, run_adapt
    from ..engine.devices import device_from_option

    device_from_option(device)  # refused in --device's words, as embed and serve refuse it, not training.device's
    run_adapt(AdaptOptions(corpus=list(corpus), output=output, base=base, preset=preset, eval=eval,
                           text_column=text_column, id_column=id_column, seed=seed, device=device,
                           precision=precision, mlm=mlm, vocab=vocab, vocab_size=vocab_size, minutes=minutes,
                           query_generator=query_generator))
