"""BERT WordPiece tokenizer: the Rust `tokenizers` engine behind transformers' call API.

Ids match transformers' pure-Python BertTokenizer (the one BERT checkpoints were
made with) on any text, not just English: the engine pipeline (`vocab_training.
build_engine`) rebuilds the reference's character classes from Python's own
unicodedata, and the two things the engine cannot do while keeping offsets
(final sigma, lone surrogates) are done here in Python, one char for one char.
"""
import json
import os
from pathlib import Path

from tokenizers import AddedToken

from ..atomic import published_folder
from ..validation import checked
from .added_tokens import add_to_engine, checked_added_tokens, config_entries, spec
from .encoding import Encoding, as_tensors
from .vocab_training import (SPECIAL_TOKENS, build_engine, check_vocab, engine_text, load_settings,
                             read_vocab_file, train_vocab)

DEFAULT_MODEL_MAX_LENGTH = 512
TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second", "do_not_truncate")
PADDING_STRATEGIES = ("longest", "max_length", "do_not_pad")


# ---------------------------------------------------------------- the tokenizer

class BertTokenizer:
    """BERT's WordPiece tokenizer with transformers' API; ids equal the pure-Python reference's.

    Build it with `from_pretrained` (checkpoint folder, vocab.txt or tokenizer.json), `from_vocab`
    or `train`. Raises ValueError on a malformed vocabulary (see `check_vocab`) or a never_split
    token that is not in it. Like transformers' fast tokenizers, a call sets the engine's
    truncation and padding, so do not share one instance between threads.
    """

    def __init__(self, vocab: dict[str, int], do_lower_case: bool = True, strip_accents: bool | None = None,
                 tokenize_chinese_chars: bool = True, never_split: list[str] | None = None,
                 model_max_length: int = DEFAULT_MODEL_MAX_LENGTH, added_tokens: list[dict] | None = None):
        check_vocab(vocab)
        # Tokens transformers' add_tokens added (`added_tokens`): matched whole before WordPiece, ids after vocab's
        self.added_tokens = checked_added_tokens(vocab, [spec(token) for token in added_tokens or []])
        never_split = list(never_split or [])
        absent = [token for token in never_split if token not in vocab]
        if absent:
            raise ValueError(f"never_split tokens {absent} are not in the vocabulary; add them to vocab.txt "
                             "or leave them out (the reference would map them to [UNK])")
        checked("model_max_length", model_max_length)
        self._vocab = {**vocab, **{token["content"]: token["id"] for token in self.added_tokens}}
        self._tokens = sorted(self._vocab, key=self._vocab.get)  # id -> token
        self._wordpiece_size = len(vocab)
        self.do_lower_case, self.strip_accents = bool(do_lower_case), strip_accents
        self.tokenize_chinese_chars, self.never_split = bool(tokenize_chinese_chars), never_split
        self.model_max_length = model_max_length
        self.truncation_side = "right"  # which end truncation cuts, "right" or "left" (transformers' attribute)
        self._special_ids = {self._vocab[token] for token in SPECIAL_TOKENS} | {
            token["id"] for token in self.added_tokens if token["special"]}
        self._engine = build_engine(dict(vocab), self.do_lower_case, strip_accents, self.tokenize_chinese_chars)
        # The reference keeps a never_split token whole when a whitespace-separated word equals it,
        # as written or once lower-cased. Closest engine match: on normalized text, never inside a word.
        self._engine.add_tokens([AddedToken(token, single_word=True, normalized=True) for token in never_split])
        add_to_engine(self._engine, self.added_tokens)

    # ---- construction

    @classmethod
    def from_vocab(cls, vocab: dict[str, int] | str | os.PathLike, **settings) -> "BertTokenizer":
        """From a {token: id} dict or a vocab.txt path; settings as in `BertTokenizer(...)`."""
        if not isinstance(vocab, dict):
            if not Path(vocab).is_file():
                raise ValueError(f"vocab file {vocab} not found; pass a vocab.txt path or a {{token: id}} dict")
            vocab = read_vocab_file(vocab)
        return cls(vocab, **settings)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, do_lower_case: bool | None = None,
                        strip_accents: bool | None = None, tokenize_chinese_chars: bool = True,
                        never_split: list[str] | None = None) -> "BertTokenizer":
        """Load from a checkpoint folder, a vocab.txt or a tokenizer.json file.

        A folder's vocab.txt is preferred over its tokenizer.json. Settings come from the
        tokenizer_config.json beside the files when there is one, else from tokenizer.json's
        normalizer; do_lower_case=, strip_accents= and tokenize_chinese_chars=False given here
        win. Raises ValueError when there is no vocabulary to read.
        """
        settings = load_settings(path)
        if do_lower_case is not None:
            settings["do_lower_case"] = do_lower_case
        if strip_accents is not None:
            settings["strip_accents"] = strip_accents
        if not tokenize_chinese_chars:
            settings["tokenize_chinese_chars"] = False
        if never_split is not None:  # given here, it wins over the folder's
            settings["never_split"] = never_split
        return cls(settings.pop("vocab"), **settings)

    @classmethod
    def train(cls, files: list[str | os.PathLike], vocab_size: int = 30522, min_frequency: int = 2,
              lowercase: bool = True, strip_accents: bool | None = None, num_unused: int = 0,
              limit_alphabet: int = 1000, text_field: str = "text") -> "BertTokenizer":
        """Learn a WordPiece vocabulary from text files; ids and errors as in `vocab_training.train_vocab`."""
        vocab = train_vocab(files, vocab_size=vocab_size, min_frequency=min_frequency, lowercase=lowercase,
                            strip_accents=strip_accents, num_unused=num_unused, limit_alphabet=limit_alphabet,
                            text_field=text_field)
        return cls(vocab, do_lower_case=lowercase, strip_accents=strip_accents)

    def with_pieces(self, pieces: list[str]) -> "BertTokenizer":
        """This tokenizer with `pieces` appended to its vocabulary (ids from vocab_size on, in order; old ids
        unchanged; pieces it already has are skipped), same settings. A "##" piece continues a word."""
        if len(self._vocab) > self._wordpiece_size:
            raise ValueError(f"this tokenizer has {len(self._vocab) - self._wordpiece_size} added token(s) after its "
                             "WordPiece vocabulary (transformers' add_tokens); new pieces would need their ids: "
                             "start from the checkpoint before tokens were added, or keep its vocabulary")
        vocab = dict(self._vocab)
        for piece in pieces:
            vocab.setdefault(piece, len(vocab))
        return type(self)(vocab, do_lower_case=self.do_lower_case, strip_accents=self.strip_accents,
                          tokenize_chinese_chars=self.tokenize_chinese_chars, never_split=self.never_split,
                          model_max_length=self.model_max_length, added_tokens=self.added_tokens)

    # ---- vocabulary

    @property
    def vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    def __len__(self) -> int:
        return len(self._vocab)

    pad_token_id = property(lambda self: self._vocab["[PAD]"])
    unk_token_id = property(lambda self: self._vocab["[UNK]"])
    cls_token_id = property(lambda self: self._vocab["[CLS]"])
    sep_token_id = property(lambda self: self._vocab["[SEP]"])
    mask_token_id = property(lambda self: self._vocab["[MASK]"])

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | list[int]:
        """Token(s) to id(s); tokens not in the vocabulary give [UNK]'s id, as in transformers."""
        if isinstance(tokens, str):
            return self._vocab.get(tokens, self.unk_token_id)
        return [self._vocab.get(token, self.unk_token_id) for token in tokens]

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False) -> str | list[str]:
        """Id(s) (int, list, 1-D tensor or array) to token(s); raises ValueError for an id outside the vocabulary."""
        ids = ids.tolist() if hasattr(ids, "tolist") else ids  # tensors, arrays and their scalars
        if isinstance(ids, int):
            return self._tokens[self._check_ids([ids])[0]]
        return [self._tokens[i] for i in self._check_ids(ids) if not (skip_special_tokens and i in self._special_ids)]

    def _check_ids(self, ids) -> list[int]:
        ids = [i.tolist() if hasattr(i, "tolist") else i for i in ids]
        bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self._tokens)]
        if bad:
            raise ValueError(f"token ids must be ints in [0, {len(self._tokens)}); got {bad[:5]}; "
                             "were they made with a different vocabulary?")
        return ids

    # ---- encoding

    def tokenize(self, text: str) -> list[str]:
        """One text -> its word pieces, without [CLS]/[SEP]. Raises ValueError when text is not a str."""
        _check_text(text, "text")
        # The engine keeps the last call's truncation and padding: a plain tokenize must not inherit them.
        self._engine.no_truncation()
        self._engine.no_padding()
        return self._engine.encode(self._prepare(text), add_special_tokens=False).tokens

    def __call__(self, text, text_pair=None, *, truncation: bool | str | None = None, max_length: int | None = None,
                 padding: bool | str = False, return_tensors: str | None = None, return_offsets_mapping: bool = False,
                 return_special_tokens_mask: bool = False, add_special_tokens: bool = True,
                 is_split_into_words: bool = False) -> Encoding:
        """Encode a text, a pair, or a batch of them, as transformers' tokenizers do.

        text / text_pair: str, or list[str] for a batch (with is_split_into_words: list[str] of
        words per text, list[list[str]] for a batch). truncation: True/"longest_first",
        "only_first", "only_second", False/"do_not_truncate"; None truncates (longest_first)
        only when max_length is given and padding is off, as transformers does. max_length
        defaults to model_max_length where truncation or padding="max_length" needs one.
        padding: True/"longest", "max_length", False/"do_not_pad" (always on the right, with
        [PAD], type id 0, mask 0). return_tensors: None, "pt" or "np" (always 2-D).
        Raises ValueError for a non-str text, unknown strategies, a max_length too small for
        the special tokens, truncation that cannot fit, or tensors of ragged lengths.
        """
        batched, inputs = self._check_inputs(text, text_pair, is_split_into_words)
        truncation = _strategy("truncation", truncation, TRUNCATION_STRATEGIES, {True: "longest_first"})
        padding = _strategy("padding", padding, PADDING_STRATEGIES, {True: "longest"})
        if return_tensors not in (None, "pt", "np"):
            raise ValueError(f"unknown return_tensors {return_tensors!r}; use 'pt', 'np' or None")
        if truncation is None:
            truncation = "longest_first" if max_length is not None and padding == "do_not_pad" else "do_not_truncate"
        if max_length is None and (truncation != "do_not_truncate" or padding == "max_length"):
            max_length = self.model_max_length
        self._configure(truncation, padding, max_length, add_special_tokens, pairs=text_pair is not None)

        try:
            encodings = self._engine.encode_batch(inputs, is_pretokenized=is_split_into_words,
                                                  add_special_tokens=add_special_tokens)
        except Exception as error:  # the engine raises plain Exception for truncation it cannot do
            if "Truncation error" not in str(error):
                raise
            raise ValueError(f"cannot truncate with truncation={truncation!r} to max_length={max_length}: {error}; "
                             "use truncation='longest_first' or a larger max_length") from None
        data = {"input_ids": [e.ids for e in encodings], "token_type_ids": [e.type_ids for e in encodings],
                "attention_mask": [e.attention_mask for e in encodings]}
        if return_offsets_mapping:
            data["offset_mapping"] = [e.offsets for e in encodings]
        if return_special_tokens_mask:
            data["special_tokens_mask"] = [e.special_tokens_mask for e in encodings]
        if return_tensors is not None:
            data = as_tensors(data, return_tensors)
        elif not batched:
            data = {key: value[0] for key, value in data.items()}
        return Encoding(data, encodings)

    def _prepare(self, text: str) -> str:
        """Python-side fixes that keep the length (so offsets stay valid): `vocab_training.engine_text`."""
        return engine_text(text, self.do_lower_case)

    def _check_inputs(self, text, text_pair, is_split_into_words: bool) -> tuple[bool, list]:
        """Validate text/text_pair; return (batched, engine inputs). Raises ValueError naming the bad value."""
        def is_one(value):
            if is_split_into_words:
                return isinstance(value, (list, tuple)) and all(isinstance(word, str) for word in value)
            return isinstance(value, str)

        def engine_input(value):
            return [self._prepare(word) for word in value] if is_split_into_words else self._prepare(value)

        batched = isinstance(text, (list, tuple)) and not is_one(text)
        texts = list(text) if batched else [text]
        for index, value in enumerate(texts):
            _check_text(value, f"text[{index}]" if batched else "text", is_split_into_words)
        if text_pair is None:
            return batched, [engine_input(value) for value in texts]
        pairs = list(text_pair) if batched and isinstance(text_pair, (list, tuple)) else [text_pair]
        if len(pairs) != len(texts):
            raise ValueError(f"text has {len(texts)} entries but text_pair has {len(pairs)}; pass one pair per text")
        for index, value in enumerate(pairs):
            _check_text(value, f"text_pair[{index}]" if batched else "text_pair", is_split_into_words)
        return batched, [(engine_input(a), engine_input(b)) for a, b in zip(texts, pairs)]

    def _configure(self, truncation: str, padding: str, max_length: int | None, add_special_tokens: bool,
                   pairs: bool) -> None:
        """Set the engine's truncation and padding for this call (like transformers' fast tokenizers do)."""
        needed = (3 if pairs else 2) if add_special_tokens else 1
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                       or max_length < needed):
            raise ValueError(f"max_length={max_length!r} is too small: {'pairs' if pairs else 'single texts'} "
                             f"need {needed} token(s){' for [CLS]/[SEP]' if add_special_tokens else ''}; "
                             f"pass max_length >= {needed}")
        if truncation == "only_second" and not pairs:
            raise ValueError("truncation='only_second' needs text_pair; use 'longest_first' or 'only_first' "
                             "for single texts")
        if truncation == "do_not_truncate":
            self._engine.no_truncation()
        else:
            self._engine.enable_truncation(max_length, strategy=truncation, direction=self.truncation_side)
        if padding == "do_not_pad":
            self._engine.no_padding()
        else:
            self._engine.enable_padding(pad_id=self.pad_token_id, pad_type_id=0, pad_token="[PAD]",
                                        length=max_length if padding == "max_length" else None)

    # ---- decoding

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = True) -> str:
        """Ids (list or 1-D tensor) -> text, exactly as transformers' BertTokenizer joins word pieces.

        Raises ValueError for an id outside the vocabulary.
        """
        tokens = self.convert_ids_to_tokens(ids, skip_special_tokens)
        text = " ".join([tokens] if isinstance(tokens, str) else tokens).replace(" ##", "").strip()
        return _clean_up_tokenization(text) if clean_up_tokenization_spaces else text

    def engine_decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Ids -> text by the `tokenizers` engine's own WordPiece decoder, as text-embeddings-inference's /decode and
        transformers 5's fast tokenizer (its defaults) decode: punctuation glued, contractions left apart ("don ' t",
        where `decode` follows the reference's clean-up, "don't"). Raises ValueError for an id outside the
        vocabulary."""
        return self._engine.decode(self._check_ids(list(ids)), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences, skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool = True) -> list[str]:
        """`decode` over a list of id lists or a 2-D tensor (batch, seq)."""
        return [self.decode(ids, skip_special_tokens, clean_up_tokenization_spaces) for ids in sequences]

    # ---- saving

    def save_pretrained(self, directory: str | os.PathLike) -> tuple[str, ...]:
        """Write vocab.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json; return their paths.

        transformers' BertTokenizer (and the pure-Python one) load the folder unchanged.
        A new folder appears whole; into an existing one (a model folder, say) each file is replaced whole
        and the folder's other files stay.
        """
        directory = Path(directory)
        self._engine.no_truncation()
        self._engine.no_padding()
        special_tokens = {f"{token[1:-1].lower()}_token": token for token in SPECIAL_TOKENS}  # "pad_token": "[PAD]"
        extra = [token["content"] for token in self.added_tokens if token["special"]]
        config = {"tokenizer_class": "BertTokenizer", "do_lower_case": self.do_lower_case,
                  "strip_accents": self.strip_accents, "tokenize_chinese_chars": self.tokenize_chinese_chars,
                  "never_split": self.never_split or None, "model_max_length": self.model_max_length,
                  "clean_up_tokenization_spaces": True, "do_basic_tokenize": True, **special_tokens,
                  **({"added_tokens_decoder": config_entries(self.added_tokens), "extra_special_tokens": extra}
                     if self.added_tokens else {})}
        contents = {  # vocab.txt is WordPiece's; tokenizer.json holds the added tokens too, as transformers saves
            "vocab.txt": "".join(token + "\n" for token in self._tokens[:self._wordpiece_size]),
            "tokenizer.json": self._engine.to_str(pretty=True),
            "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False) + "\n",
            "special_tokens_map.json": json.dumps({**special_tokens, **({"additional_special_tokens": extra}
                                                                        if extra else {})}, indent=2) + "\n",
        }
        with published_folder(directory, existing="merge") as staging:
            for name, text in contents.items():
                (staging / name).write_text(text, encoding="utf-8")
        return tuple(str(directory / name) for name in contents)

    def __repr__(self) -> str:
        return (f"BertTokenizer(vocab_size={self.vocab_size}, do_lower_case={self.do_lower_case}, "
                f"strip_accents={self.strip_accents}, model_max_length={self.model_max_length})")


# ---------------------------------------------------------------- helpers

def _check_text(value, name: str, is_split_into_words: bool = False) -> None:
    """Raise ValueError unless value is a str (a list of str words with is_split_into_words)."""
    if is_split_into_words:
        if isinstance(value, (list, tuple)) and all(isinstance(word, str) for word in value):
            return
        raise ValueError(f"{name} must be a list of str words with is_split_into_words=True, got {value!r:.80}")
    if isinstance(value, str):
        return
    hints = {bytes: "decode it first, e.g. text.decode('utf-8')",
             type(None): "None usually marks a missing value: drop it or use ''"}
    hint = hints.get(type(value), "convert it with str()")
    raise ValueError(f"{name} must be a str (or a list of str for a batch), got {type(value).__name__} "
                     f"{value!r:.60}; {hint}")


def _strategy(kind: str, value, choices: tuple[str, ...], aliases: dict) -> str | None:
    """Normalise a truncation/padding argument to one of `choices` (None passes through for truncation)."""
    if value is None and kind == "truncation":
        return None
    if value is False:
        return choices[-1]
    if value is True:
        return aliases[True]
    if isinstance(value, str) and value in choices:
        return value
    raise ValueError(f"unknown {kind} {value!r}; use True, False or one of {', '.join(choices)}")


def _clean_up_tokenization(text: str) -> str:
    """transformers' clean_up_tokenization: glue punctuation and English contractions back on."""
    for spaced, glued in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(spaced, glued)
    return text
