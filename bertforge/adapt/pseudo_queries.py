"""GPL-style pseudo-queries: a query generator writes the questions a passage answers (doc2query, Nogueira et al.
2019; GPL, Wang et al. 2022), and each becomes a training anchor for its passage.

ICT's anchors are the corpus's own sentences, so they share the passage's words and style; what users type is
shorter and asks. A user who has a doc2query model (a T5 trained on MS MARCO to write queries for a passage, e.g.
doc2query/msmarco-t5-base-v1 or BeIR/query-gen-msmarco-t5-base-v1, from the hub or a local folder) gives it with
`--query-generator`; the ICT stage then draws a generated query as the anchor for GENERATED_SHARE of its examples,
against the whole passage (the query was not cut from it), with the same in-batch and mined negatives and the
same teacher term. Without one, adapt trains on ICT alone and says so in the report.

Generation is a cached stage of its own (its key: the corpus, the generator, these settings). It samples as GPL
does (top-p 0.95, QuerySettings.per_passage queries a passage) in a seeded order of the training passages, writes
a JSON line per passage as it goes, and a killed run picks up after the last whole line; each batch draws from its
own seed, so a resumed stage writes what an uninterrupted one would have. Under a time budget (quick's 20
minutes) the first batch is timed and generation stops at the passages that fit QUERY_SHARE of the training time:
the rest train on ICT alone. The generator is a transformers sequence-to-sequence model, loaded only here
(`pip install 'bertforge[generate]'`).
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..atomic import write_lines, write_text
from ..errors import TrainingInterrupted, UsageError
from ..search.documents import normalise

QUERIES_FILE = "queries.jsonl"  # {"passage": corpus index, "queries": [...]} a line per passage, in drawing order
PLAN_FILE = "plan.json"  # the passages a budget allowed, kept for a resumed stage
GENERATED_SHARE = 0.5  # of the ICT stage's examples whose passage has queries, this share takes one as the anchor
PROGRESS_EVERY = 100  # passages between progress lines
QUERY_SHARE = 1 / 3  # under a time budget, generation may take this share of what the training stages would have


@dataclass(frozen=True)
class QuerySettings:
    """How queries are drawn: GPL's (3 per passage, nucleus sampling at 0.95, passages cut at 350 tokens)."""

    per_passage: int = 3
    top_p: float = 0.95
    max_query_tokens: int = 64
    max_passage_tokens: int = 350
    batch_size: int = 8  # passages per generate() call
    seed: int = 0


def check_generator(name: str) -> None:
    """Raise UsageError (one line) unless `name` is a sequence-to-sequence model transformers can load: adapt
    checks before its first stage rather than after the baselines' minutes."""
    with loading(name) as transformers:
        if not transformers.AutoConfig.from_pretrained(name).is_encoder_decoder:
            raise ValueError("its config is not an encoder-decoder's")


@contextlib.contextmanager
def loading(name: str):
    """transformers, with what goes wrong while loading `name` turned into one line saying what to give."""
    try:
        import transformers
    except ImportError:
        raise UsageError("--query-generator needs transformers: pip install 'bertforge[generate]'") from None
    try:
        yield transformers
    except (OSError, ValueError, KeyError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"--query-generator {name}: no sequence-to-sequence model could be loaded from it "
                         f"({reason}); give a doc2query T5 folder or hub name, e.g. "
                         "doc2query/msmarco-t5-base-v1") from None


class QueryGenerator:
    """A sequence-to-sequence model and its tokenizer (transformers), writing queries for passages."""

    def __init__(self, name: str, device: torch.device):
        with loading(name) as transformers:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(name)
            self.model = transformers.AutoModelForSeq2SeqLM.from_pretrained(name).to(device).eval()
        self.name, self.device = name, device

    def queries(self, passages: list[str], settings: QuerySettings, seed: int) -> list[list[str]]:
        """settings.per_passage sampled queries for each passage (distinct, non-empty: fewer when they repeat)."""
        encoded = self.tokenizer(passages, truncation=True, max_length=settings.max_passage_tokens, padding=True,
                                 return_tensors="pt").to(self.device)
        with torch.random.fork_rng(devices=[]), torch.inference_mode():  # the caller's random stream is untouched
            torch.manual_seed(seed)
            generated = self.model.generate(**encoded, do_sample=True, top_p=settings.top_p,
                                            max_new_tokens=settings.max_query_tokens,
                                            num_return_sequences=settings.per_passage)
        texts = self.tokenizer.batch_decode(generated, skip_special_tokens=True)
        grouped = [texts[i * settings.per_passage:(i + 1) * settings.per_passage] for i in range(len(passages))]
        # Normalised as the corpus's own text is (corpus.normalise), so a query and a passage read the same way
        return [list(dict.fromkeys(filter(None, map(normalise, group)))) for group in grouped]


def drawing_order(passages: Sequence[int], seed: int) -> list[int]:
    """The training passages in the seeded order generation visits them: a budget that stops early keeps a
    sample of the corpus, not its first chapters."""
    return [int(i) for i in np.random.default_rng([seed, 17]).permutation(np.asarray(passages, dtype=np.int64))]


def read_queries(folder: Path) -> dict[int, list[str]]:
    """{corpus index: queries} from the whole lines of folder/QUERIES_FILE (a killed write's partial last line is
    left out)."""
    return {row["passage"]: row["queries"] for row in map(json.loads, whole_lines(folder / QUERIES_FILE))
            if row["queries"]}


def whole_lines(path: Path, cut: bool = False) -> list[str]:
    """The whole lines of a queries file; cut: also cut a killed write's partial last line off the file."""
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    whole = text[:text.rfind("\n") + 1]
    lines = whole.split("\n")[:-1]  # on newlines alone: a query may hold U+2028, which splitlines() splits on
    if cut and len(whole) < len(text):
        write_lines(path, lines)  # atomically: a kill while cutting keeps every whole line
    return lines


def generate_queries(generator: QueryGenerator, texts: Sequence[str], passages: Sequence[int],
                     settings: QuerySettings, folder: Path, seconds: float | None = None) -> dict[int, list[str]]:
    """Queries for the passages (corpus indices into `texts`), written to folder/QUERIES_FILE a line per passage
    and resumed from it; {corpus index: queries}.

    seconds: the time generation may take (None: every passage). The first batch is timed, and the passages that
    fit are kept in folder/PLAN_FILE, which a resumed stage reads instead of timing again.
    """
    folder.mkdir(parents=True, exist_ok=True)
    order = drawing_order(passages, settings.seed)
    plan = folder / PLAN_FILE
    planned = json.loads(plan.read_text(encoding="utf-8"))["passages"] if plan.is_file() else None
    path = folder / QUERIES_FILE
    done = len(whole_lines(path, cut=True))
    started, start = time.time(), done
    total = len(order) if planned is None else planned
    with path.open("a", encoding="utf-8") as lines:
        try:
            while start < total:
                end = min(start + settings.batch_size, total)
                batch = order[start:end]
                batch_started = time.perf_counter()
                drawn = generator.queries([texts[i] for i in batch], settings, seed=settings.seed * 1_000_003 + start)
                for index, queries in zip(batch, drawn):
                    lines.write(json.dumps({"passage": index, "queries": queries}, ensure_ascii=False) + "\n")
                lines.flush()
                if planned is None:
                    timed = (time.perf_counter() - batch_started) / len(batch)
                    planned = total = fitting(len(order), end, timed, seconds)
                    write_text(plan, json.dumps({"passages": planned, "of": len(order), "passage_seconds": timed,
                                                 "seconds": seconds}) + "\n")
                    if planned < len(order):
                        print(f"time budget: queries for {planned:,} of {len(order):,} passages "
                              f"({timed:.2f} s a passage here); the rest train on ICT alone", flush=True)
                progress(end, len(batch), total, done, started)
                start = end
        except KeyboardInterrupt:
            raise TrainingInterrupted(f"stopped generating queries after {start:,} of {total:,} "
                                      f"passages (kept in {path})") from None
    return read_queries(folder)


def fitting(total: int, done: int, passage_seconds: float, seconds: float | None) -> int:
    """How many passages generation covers: all of them, or those that fit `seconds` at passage_seconds each
    (at least the ones already written)."""
    if seconds is None:
        return total
    return min(total, max(done, math.floor(max(0.0, seconds) / max(passage_seconds, 1e-9))))


def progress(written: int, batch: int, planned: int, resumed_from: int, started: float) -> None:
    """A line every PROGRESS_EVERY passages and at the end: passages, rate, time left."""
    if written < planned and written // PROGRESS_EVERY == (written - batch) // PROGRESS_EVERY:
        return
    rate = (written - resumed_from) / max(time.time() - started, 1e-9)
    left = (planned - written) / max(rate, 1e-9)
    print(f"queries: {written:,} / {planned:,} passages, {rate:.2f} passages/s, {left:.0f} s left", flush=True)
