"""A small SQuAD-format set from real Austen paragraphs, for the QA tests (a helper, not a test file).

Each answerable question is a cloze made from one sentence of its paragraph: the one character
name in it becomes "Who" ("Elizabeth could not but smile." → "Who could not but smile?") and the
answer is that name, with its title ("Mr. Darcy"), at its character offset. v2's impossible
questions are such clozes asked of a paragraph from another novel that never names the answer.
The questions copy their sentence's other words, so a model can learn them in a few steps.
"""
import random
import re
from pathlib import Path

from bertforge.tasks.qa.squad import Answer, QAExample

NAMES = ("Elizabeth", "Jane", "Lydia", "Kitty", "Charlotte", "Bennet", "Darcy", "Bingley", "Wickham", "Collins",
         "Lucas", "Emma", "Harriet", "Frank", "Woodhouse", "Knightley", "Elton", "Weston", "Churchill", "Fairfax",
         "Bates", "Elinor", "Marianne", "Edward", "Dashwood", "Ferrars", "Willoughby", "Brandon", "Jennings",
         "Fanny", "Edmund", "Bertram", "Crawford", "Norris", "Rushworth", "Catherine", "Isabella", "Tilney",
         "Thorpe", "Morland", "Anne", "Wentworth", "Elliot", "Musgrove", "Russell", "Louisa", "Henrietta")
# An optional title, then one or two names: "Mr. Darcy", "Frank Churchill", "Emma". A possessive
# ("Emma's") is left out: "Who's" would turn the sentence into another question.
_NAME = "|".join(NAMES)
_MENTION = re.compile(rf"\b(?:(?:Mr|Mrs|Miss|Lady|Sir|Colonel|Captain|Dr)\.? )?(?:{_NAME})(?: (?:{_NAME}))?\b(?!')")
# A sentence ends at . ! or ? (and a closing quote) before a capital; not after a title's full stop.
_SENTENCE_END = re.compile(r"""[.!?]["']?(?=\s+["']?[A-Z])""")
_TITLE_BEFORE = re.compile(r"\b(?:Mr|Mrs|Dr|St|Ms)$")


def build_austen_squad(austen_dir, n_questions: int = 300, seed: int = 0, version_2: bool = False,
                       min_words: int = 60, max_words: int = 300) -> list[QAExample]:
    """n_questions cloze examples from paragraphs of min_words..max_words words; same seed, same set.

    version_2: a third of them (rounded down) are impossible. At most one question per paragraph.
    Raises ValueError when the folder has no .txt files or too few paragraphs for n_questions.
    """
    books = sorted(Path(austen_dir).glob("*.txt"))
    if not books:
        raise ValueError(f"no .txt novels in {austen_dir}")
    paragraphs = [(book.stem, context) for book in books for context in _paragraphs(book, min_words, max_words)]
    rng = random.Random(seed)
    rng.shuffle(paragraphs)
    n_impossible = n_questions // 3 if version_2 else 0

    examples, clozes = [], _clozes(paragraphs, rng)
    for title, context, question, answer in clozes:
        if len(examples) == n_questions - n_impossible:
            break
        examples.append(QAExample(f"austen-{len(examples):05d}", question, context, [answer], False, title))
    for title, _, question, answer in clozes:
        if len(examples) == n_questions:
            break
        other_title, other_context = _unrelated_paragraph(paragraphs, title, answer.text, rng)
        examples.append(QAExample(f"austen-{len(examples):05d}", question, other_context, [], True, other_title))
    if len(examples) < n_questions:
        raise ValueError(f"only {len(examples)} questions found; ask for fewer or widen min_words/max_words")
    return examples


def _paragraphs(book: Path, min_words: int, max_words: int) -> list[str]:
    blocks = re.split(r"\n\s*\n", book.read_text(encoding="utf-8"))
    joined = (" ".join(block.split()) for block in blocks)  # hard-wrapped lines become one line
    return [text for text in joined if min_words <= len(text.split()) <= max_words]


def _clozes(paragraphs: list[tuple[str, str]], rng: random.Random):
    """Yield (title, context, question, answer), one per paragraph that has a usable sentence.

    One generator serves both kinds of question, so the impossible ones go on where the others stopped.
    """
    for title, context in paragraphs:
        candidates = [cloze for start, end in _sentence_spans(context)
                      if (cloze := _cloze(context, start, end)) is not None]
        if candidates:
            question, answer = rng.choice(candidates)
            yield title, context, question, answer


def _sentence_spans(text: str) -> list[tuple[int, int]]:
    spans, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        if _TITLE_BEFORE.search(text, 0, match.start()):
            continue
        spans.append((start, match.end()))
        start = match.end() + 1
    spans.append((start, len(text)))
    return spans


def _cloze(context: str, start: int, end: int) -> tuple[str, Answer] | None:
    """(question, answer) from the sentence context[start:end] when it names exactly one character."""
    sentence = context[start:end]
    mentions = list(_MENTION.finditer(sentence))
    if len(mentions) != 1 or not 6 <= len(sentence.split()) <= 40:
        return None
    mention = mentions[0]
    question = sentence[:mention.start()] + "Who" + sentence[mention.end():]
    question = question.strip(" \"'_-").rstrip(".!?;:,\"'_- ") + "?"
    return question, Answer(mention.group(), start + mention.start())


def _unrelated_paragraph(paragraphs: list[tuple[str, str]], title: str, answer: str,
                         rng: random.Random) -> tuple[str, str]:
    """A paragraph of another novel that names none of the answer's words."""
    words = [word for word in answer.split() if word in NAMES]  # not the title: "Mr" is everywhere
    while True:
        other_title, other_context = rng.choice(paragraphs)
        if other_title != title and not any(re.search(rf"\b{word}\b", other_context) for word in words):
            return other_title, other_context
