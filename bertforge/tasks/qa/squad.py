"""SQuAD v1.1 / v2.0 JSON: read it into examples (every bad record named by article and question), write it back.

The QA pipeline is run_squad.py's (google-research/bert): examples here, windowed features in
`features`, answers from start/end logits in `answers`, the official EM/F1 in `scoring`; on
character offsets from the tokenizer instead of whitespace words, so an answer is a slice of
the context and run_squad's `_improve_answer_span` / `get_final_text` alignments are not needed.
"""
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ...input_files import not_utf8, open_text, require_file
from ...tokenization.vocab_training import is_dropped

logger = logging.getLogger("bertforge")


@dataclass
class Answer:
    """One gold answer: its text and the character index where it starts in the context."""
    text: str
    start: int

    @property
    def end(self) -> int:
        return self.start + len(self.text)


@dataclass
class QAExample:
    """One question about one context; `answers` is empty when `is_impossible` (SQuAD v2.0)."""
    id: str
    question: str
    context: str
    answers: list[Answer] = field(default_factory=list)
    is_impossible: bool = False
    title: str = ""


class SquadExamples(list):
    """The examples read from a file, as a list, with `problems`: one line per row skipped or doubted."""

    def __init__(self, examples=(), problems=()):
        super().__init__(examples)
        self.problems = list(problems)


def read_squad(path: str | os.PathLike, training: bool = True) -> SquadExamples:
    """Read an official SQuAD JSON file (data → paragraphs → qas) into examples, in file order.

    v1.1 and v2.0 files both read (is_impossible defaults to False). Rows that cannot be used are
    skipped with a warning, logged and listed on the result's `problems`: an empty question or
    context (`is_blank`: no text the tokenizer reads), a repeated id, an answerable question without
    answers. An answer whose text is not at its answer_start would teach the wrong span: with
    `training` it is dropped (and the example with it when no answer is left); with training=False
    answers are only gold texts for scoring, so it is reported and kept. Raises ValueError for a
    missing file, text that is not JSON, or a structure that is not SQuAD's (the message names the
    place, e.g. data[0].paragraphs[2]).
    """
    path = Path(path)
    require_file(path, "SQuAD file")
    try:
        with open_text(path) as file:  # .gz / .xz too, a byte-order mark dropped
            root = json.load(file)
    except UnicodeDecodeError:
        raise ValueError(not_utf8(path)) from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error.msg}, line {error.lineno}); "
                         "a SQuAD file is one JSON object with a 'data' list") from None
    examples, seen_ids = SquadExamples(), set()

    def skip(where: str, message: str) -> None:
        examples.problems.append(f"{where}: {message}")
        logger.warning("%s: %s: %s", path, where, message)

    try:
        _read_examples(root, examples, seen_ids, skip, training)
    except ValueError as error:  # the structure is not SQuAD's: say which file
        raise ValueError(f"{path}: {error}") from None
    return examples


_REQUIRED = object()


def is_blank(text: str) -> bool:
    """Whether a text gives the tokenizer nothing to read: only whitespace and the characters it deletes
    (control and format characters such as zero-width spaces and soft hyphens, U+FFFD). Such a context has
    no token to answer from, so it is skipped as an empty one is, not answered with ""."""
    return all(char.isspace() or is_dropped(char) for char in text)


def _read_examples(root, examples: SquadExamples, seen_ids: set, skip, training: bool) -> None:
    """Walk SQuAD's data -> paragraphs -> qas into `examples`; ValueError naming the place of a wrong structure."""
    for a, article in enumerate(_field(root, "data", list, "the file")):
        title = _field(article, "title", str, f"data[{a}]", default="")
        for p, paragraph in enumerate(_field(article, "paragraphs", list, f"data[{a}]")):
            where = f"data[{a}].paragraphs[{p}]"
            context = _field(paragraph, "context", str, where)
            for q, qa in enumerate(_field(paragraph, "qas", list, where)):
                row = f"{where}.qas[{q}]"
                qid = str(_field(qa, "id", (str, int), row))
                question = _field(qa, "question", str, row)
                impossible = _field(qa, "is_impossible", bool, row, default=False)
                answers = [Answer(_field(answer, "text", str, f"{row}.answers[{i}]"),
                                  _field(answer, "answer_start", int, f"{row}.answers[{i}]"))
                           for i, answer in enumerate(_field(qa, "answers", list, row, default=[]))]
                row = f"{row} (id {qid!r})"
                empty = _empty_text(question, context)
                if empty:
                    skip(row, f"{empty}; example skipped")
                    continue
                if qid in seen_ids:
                    skip(row, "id already used by an earlier question; example skipped")
                    continue
                if impossible and answers:
                    skip(row, "is_impossible but has answers; the answers are ignored")
                    answers = []
                misplaced = [answer for answer in answers if context[answer.start:answer.end] != answer.text
                             or not answer.text.strip() or answer.start < 0]
                for answer in misplaced:
                    found = context[max(answer.start, 0):answer.end]
                    skip(row, f"answer {answer.text!r} is not at answer_start {answer.start} (the context there "
                              f"reads {found!r}); " + ("answer dropped" if training else "kept as gold text only"))
                if training:
                    answers = [answer for answer in answers if answer not in misplaced]
                if not impossible and not answers:
                    if training:
                        skip(row, "no usable answer for an answerable question; example skipped")
                        continue
                    if not misplaced and "answers" in qa:
                        skip(row, "answerable question without answers; it can be predicted but not scored")
                seen_ids.add(qid)
                examples.append(QAExample(qid, question, context, answers, impossible, title))


def _empty_text(question: str, context: str) -> str | None:
    """"empty question" or "empty context" (saying so when the text only looks non-empty), or None."""
    for name, text in (("question", question), ("context", context)):
        if is_blank(text):
            return f"empty {name}" + (" (only characters the tokenizer drops, e.g. zero-width spaces)"
                                      if text.strip() else "")
    return None


def _field(record, key: str, kind, where: str, default=_REQUIRED):
    """record[key] checked to be of `kind` (bool is never an int); the default when absent and allowed."""
    if not isinstance(record, dict):
        raise ValueError(f"{where} is a JSON {type(record).__name__}, not an object; "
                         "a SQuAD file nests data → paragraphs → qas → answers, each a list of objects")
    if key not in record:
        if default is not _REQUIRED:
            return default
        raise ValueError(f"{where} has no {key!r} field (found {sorted(record)}); "
                         "is this a SQuAD file (data → paragraphs → context, qas)?")
    value = record[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise ValueError(f"{where}.{key} is a {type(value).__name__}, expected "
                         f"{' or '.join(k.__name__ for k in kinds)}; fix the file")
    return value


def write_squad(examples: list[QAExample], path: str | os.PathLike, version_2: bool = False) -> None:
    """Write examples as an official SQuAD JSON file: articles by title, paragraphs by context, in
    first-seen order. v2.0 adds is_impossible to every question. Raises ValueError when asked to
    write an impossible question as v1.1, which has no way to say so.
    """
    if not version_2 and any(example.is_impossible for example in examples):
        raise ValueError("SQuAD v1.1 has no impossible questions; pass version_2=True or leave them out")
    articles: dict[str, dict[str, list]] = {}
    for example in examples:
        qa = {"id": example.id, "question": example.question,
              "answers": [{"text": answer.text, "answer_start": answer.start} for answer in example.answers]}
        if version_2:
            qa["is_impossible"] = example.is_impossible
        articles.setdefault(example.title, {}).setdefault(example.context, []).append(qa)
    data = [{"title": title, "paragraphs": [{"context": context, "qas": qas} for context, qas in paragraphs.items()]}
            for title, paragraphs in articles.items()]
    document = {"version": "v2.0" if version_2 else "1.1", "data": data}
    Path(path).write_text(json.dumps(document, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
