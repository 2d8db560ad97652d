"""One reader of a checkpoint folder: plain Hugging Face or sentence-transformers (2.x to 6.x).

`read_model_folder(path)` says, once, everything a command needs to know about a folder
before loading it: where the BERT weights are, which class config.json names, and how
sentence-transformers (ST) turns the encoder's token states into a sentence vector
(pooling, Normalize, truncation length, prompts, similarity). Every command and the Python
API read folders through it, so a folder gives the same vectors everywhere.

An ST folder lists its modules in modules.json, each with a subfolder ("" for the root) and a
type: `sentence_transformers.models.Pooling` (2.x-5.x), `sentence_transformers.sentence_transformer.
modules.pooling.Pooling` (6.x), `sentence_transformers.models.BERT` (0.x), and so on; the class
name at the end is what counts. A Pooling config holds `pooling_mode` (6.x: a name or a list) or
the older `pooling_mode_*` booleans; several modes are concatenated in the order ST concatenates them:
a list's, the booleans' fixed one (POOLING_MODES). A plain HF
folder (no modules.json) is read as ST reads one: mean pooling, no normalisation.

Use: `folder = read_model_folder(path)`; load the weights from `folder.transformer` and the tokenizer with
`tokenization.folder.load_tokenizer(folder)` (the files there, lower-cased as ST's do_lower_case says);
`Embedder.from_pretrained`, `BiEncoder.from_pretrained` and `export_onnx` take the ModelFolder itself, and
`embeddings.folder_vectors.folder_options(folder)` is the Embedder options that give its vectors (a BiEncoder carries
the folder's pooling, normalisation, length, prompts and lower-casing, and saves them back).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .weight_files import WEIGHT_FILES

MODULES_FILE = "modules.json"
ST_CONFIG_FILE = "config_sentence_transformers.json"
HF_CONFIG_FILE = "config.json"
MODULE_CONFIG_FILE = "config.json"  # each ST module's own settings, in its subfolder
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# The Transformer module's own config (max_seq_length, do_lower_case), under the names ST has
# used over the years, looked for in this order as ST 6.2 does (Transformer.load_config).
TRANSFORMER_CONFIG_FILES = ("sentence_bert_config.json", "sentence_roberta_config.json",
                            "sentence_distilbert_config.json", "sentence_camembert_config.json",
                            "sentence_albert_config.json", "sentence_xlm-roberta_config.json",
                            "sentence_xlnet_config.json")
# ST's pre-6 Pooling keys -> its mode names, in the order ST (6.x too) concatenates the modes those keys turn on
# (its pooling.py); a 6.x `pooling_mode` list concatenates in its own order instead.
LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
POOLING_MODES = tuple(LEGACY_POOLING_KEYS.values())
# Several modes at once are written joined by this, in the order their vectors are concatenated (as a 6.x list).
POOLING_JOIN = "+"
# The prompt names sentence-transformers 6 gives every model (its encode_query / encode_document), empty unless a
# folder's config_sentence_transformers.json sets them: `prompt_name="query"` works with any model there.
STANDARD_PROMPTS = {"query": "", "document": ""}
# Module class names (the end of modules.json's "type") bertforge reproduces, by role.
MODULE_ROLES = {"Transformer": "transformer", "BERT": "transformer", "Pooling": "pooling", "Normalize": "normalize"}
# tokenizer_config.json says this (transformers' VERY_LARGE_INTEGER) when it knows no limit.
UNKNOWN_MAX_LENGTH = int(1e20)
# The files that decide what a model computes: weights, configuration and vocabulary (`model_fingerprint`).
FINGERPRINT_FILES = ("config.json", *WEIGHT_FILES, "vocab.txt", "tokenizer.json")


@dataclass(frozen=True)
class ModelFolder:
    """What a checkpoint folder holds and how sentence-transformers would embed with it.

    root: the folder given. transformer: the folder with config.json, weights and tokenizer
    (the root, or an ST module's subfolder such as 0_Transformer). architecture: config.json's
    first `architectures` entry (BertModel when it names none). pooling: "mean", "cls", "max",
    "mean_sqrt_len_tokens", "weightedmean", "lasttoken", or several joined by "+" (concatenated in that order).
    normalize: an ST Normalize module follows the pooling. max_seq_length: the tokens ST
    truncates to. do_lower_case: ST lower-cases texts before its tokenizer. prompts,
    default_prompt_name, similarity_fn_name: config_sentence_transformers.json's.
    """

    root: Path
    transformer: Path
    architecture: str = "BertModel"
    pooling: str = "mean"
    normalize: bool = False
    max_seq_length: int = 512
    include_prompt: bool = True
    do_lower_case: bool = False
    prompts: dict[str, str] = field(default_factory=lambda: dict(STANDARD_PROMPTS), hash=False)
    default_prompt_name: str | None = None
    similarity_fn_name: str = "cosine"
    sentence_transformers: bool = False  # the folder has a modules.json

    @property
    def pooling_modes(self) -> tuple[str, ...]:
        return tuple(self.pooling.split(POOLING_JOIN))

    @property
    def default_prompt(self) -> str:
        return default_prompt(self.prompts, self.default_prompt_name)

    @property
    def source(self) -> str:
        """Where the vector settings come from, for messages that say which choice an option overrides."""
        return "the folder's sentence-transformers modules" if self.sentence_transformers else "a plain checkpoint's default"


def default_prompt(prompts: dict[str, str], default_prompt_name: str | None) -> str:
    """The text ST puts before every input when none is named ("" when the folder names none)."""
    return prompts.get(default_prompt_name, "") if default_prompt_name else ""


def is_model_folder(path: str | os.PathLike) -> bool:
    """Whether `path` is a folder `read_model_folder` reads as a model (a plain checkpoint's config.json, or a
    sentence-transformers folder's modules.json), not one of vocabulary files alone."""
    path = Path(path)
    return (path / "config.json").is_file() or (path / MODULES_FILE).is_file()


def read_model_folder(path: str | os.PathLike) -> ModelFolder:
    """Read a checkpoint folder (or packaged short name, or hub id) into a ModelFolder; nothing is loaded.

    Raises ValueError, one line naming the file, for a folder without config.json, a damaged
    JSON file, or an ST module list bertforge does not reproduce (Dense, custom modules, no
    Pooling, a Normalize before the pooling, a prompt excluded from pooling).
    """
    from .checkpoint import resolve_checkpoint

    root = Path(resolve_checkpoint(path))
    if not (root / MODULES_FILE).is_file():
        return plain_folder(root, root)
    modules = read_modules(root / MODULES_FILE)
    transformer = root / modules["transformer"]
    pooling = read_pooling(root / modules["pooling"] / MODULE_CONFIG_FILE)
    settings = read_json(root / ST_CONFIG_FILE) if (root / ST_CONFIG_FILE).is_file() else {}
    check_model_type(settings, root / ST_CONFIG_FILE)
    plain = plain_folder(root, transformer)
    transformer_config = read_transformer_config(transformer)
    folder = ModelFolder(
        root=root, transformer=transformer, architecture=plain.architecture,
        pooling=pooling["mode"], include_prompt=pooling["include_prompt"], normalize="normalize" in modules,
        max_seq_length=max_seq_length(transformer, transformer_config.get("max_seq_length")),
        do_lower_case=bool(transformer_config.get("do_lower_case", False)),
        prompts={**STANDARD_PROMPTS, **(settings.get("prompts") or {})},
        default_prompt_name=settings.get("default_prompt_name"),
        similarity_fn_name=settings.get("similarity_fn_name") or "cosine", sentence_transformers=True)
    check_prompt_pooled(folder, folder.default_prompt, f"the default prompt {folder.default_prompt_name!r}")
    return folder


def check_prompt_pooled(folder: ModelFolder, prompt: str, what: str) -> None:
    """Raise ValueError when `prompt` is not empty and the folder's Pooling leaves a prompt out of the vector
    (include_prompt false): bertforge pools over every token, so its vectors would not be sentence-transformers'.
    Every door that puts a prompt before a text asks here (the folder's default, Embedder's prompt, the server's
    prompt names and --default-prompt)."""
    if prompt and not folder.include_prompt:
        raise ValueError(f"{what}: {folder.root}'s Pooling leaves the prompt out of the vector (include_prompt "
                         "false), which bertforge does not reproduce (it pools every token); embed with "
                         "sentence-transformers, or without the prompt")


def plain_folder(root: Path, transformer: Path) -> ModelFolder:
    """A Hugging Face folder read as ST reads one without modules.json: mean pooling, no normalisation."""
    config_file = transformer / HF_CONFIG_FILE
    if not config_file.is_file():
        raise ValueError(f"{transformer} is not a checkpoint folder (no {HF_CONFIG_FILE} there); pass a folder "
                         "written by save_pretrained or a packaged name such as minilm")
    config = read_json(config_file)
    architecture = (config.get("architectures") or ["BertModel"])[0]
    return ModelFolder(root=root, transformer=transformer, architecture=architecture,
                       max_seq_length=max_seq_length(transformer, None))


def read_modules(modules_file: Path) -> dict[str, str]:
    """modules.json -> {role: subfolder} for transformer, pooling (and normalize), in ST's order."""
    entries = read_json(modules_file)
    if not all(isinstance(e, dict) and "type" in e for e in entries):
        raise ValueError(f"{modules_file} is not a sentence-transformers module list (a JSON list of "
                         "{\"path\", \"type\"} objects); re-save the model with sentence-transformers")
    roles: dict[str, str] = {}
    for entry in entries:
        kind = str(entry["type"]).rsplit(".", 1)[-1]
        # A type outside ST's own package is custom code, whatever its class is called.
        role = MODULE_ROLES.get(kind) if str(entry["type"]).startswith("sentence_transformers.") else None
        if role is None:
            raise ValueError(f"{modules_file}: module {kind} ({entry['type']}) is not one bertforge reproduces (it "
                             "reads Transformer, Pooling and Normalize); encode with sentence-transformers instead")
        if role in roles:
            raise ValueError(f"{modules_file} lists {kind} twice; bertforge reproduces Transformer -> Pooling "
                             "[-> Normalize] only")
        if role == "normalize":
            check_normalize(modules_file.parent / str(entry.get("path", "")), "pooling" in roles, modules_file)
        roles[role] = str(entry.get("path", ""))
    if "transformer" not in roles or "pooling" not in roles:
        missing = "Transformer" if "transformer" not in roles else "Pooling"
        raise ValueError(f"{modules_file} has no {missing} module; bertforge reproduces Transformer -> Pooling "
                         "[-> Normalize]")
    return roles


def check_normalize(folder: Path, after_pooling: bool, modules_file: Path) -> None:
    """A Normalize module must act on the pooled vector (ST 6 can also normalise token states)."""
    config_file = folder / MODULE_CONFIG_FILE
    config = read_json(config_file) if config_file.is_file() else {}
    target = config.get("module_input_name", "sentence_embedding")
    if not after_pooling or target != "sentence_embedding":
        raise ValueError(f"{modules_file}: its Normalize acts on {target if after_pooling else 'the token states'}, "
                         "not the pooled sentence vector; bertforge reproduces Transformer -> Pooling -> Normalize")


def read_pooling(config_file: Path) -> dict[str, Any]:
    """A Pooling config, 6.x (`pooling_mode`) or older (`pooling_mode_*` booleans) -> mode and include_prompt."""
    config = read_json(config_file) if config_file.is_file() else {}
    mode = config.get("pooling_mode")
    if mode is None:
        # ST: no boolean set means mean (_convert_legacy_pooling_kwargs).
        modes = [name for key, name in LEGACY_POOLING_KEYS.items() if config.get(key)] or ["mean"]
    else:
        modes = [mode] if isinstance(mode, str) else list(mode)
    unknown = [m for m in modes if m not in POOLING_MODES]
    if unknown or not modes:
        raise ValueError(f"{config_file}: pooling mode {unknown or modes} is not one of {', '.join(POOLING_MODES)}")
    return {"mode": POOLING_JOIN.join(modes), "include_prompt": bool(config.get("include_prompt", True))}


def pooling_config(pooling: str, dimension: int) -> dict[str, Any]:
    """The Pooling config.json that sentence-transformers (and `read_pooling`) reads back as `pooling` ("mean+cls":
    [mean | cls]). Modes in ST's fixed order (one mode, or "cls+mean") are written as the `pooling_mode_*` booleans,
    which every release from 2.x on reads, 6.x in that same order. Any other order (or a mode twice) only a 6.x list
    says: the booleans would be read back in the fixed order, another vector than the one trained, where ST before 6
    fails to load a list rather than swap its halves. ValueError for an unknown mode."""
    modes = pooling.split(POOLING_JOIN)
    unknown = [mode for mode in modes if mode not in POOLING_MODES]
    if unknown:
        raise ValueError(f"pooling {pooling!r}: {unknown} is not one of {', '.join(POOLING_MODES)}")
    if pooling == in_fixed_order(pooling) and len(set(modes)) == len(modes):
        selected = {key: mode in modes for key, mode in LEGACY_POOLING_KEYS.items()}
    else:
        selected = {"pooling_mode": modes}
    return {"word_embedding_dimension": dimension, **selected, "include_prompt": True}


def in_fixed_order(pooling: str) -> str:
    """"mean+cls" -> "cls+mean": the modes in the order ST concatenates its `pooling_mode_*` booleans
    (POOLING_MODES), which is what bertforge concatenated, whatever the order named, before it followed the order
    named (an index of format 2 or older, search/folder.py). One mode (or "pooler") is left as it is."""
    modes = pooling.split(POOLING_JOIN)
    return pooling if len(modes) == 1 else POOLING_JOIN.join(sorted(modes, key=POOLING_MODES.index))


def read_transformer_config(transformer: Path) -> dict[str, Any]:
    for name in TRANSFORMER_CONFIG_FILES:
        if (transformer / name).is_file():
            return read_json(transformer / name)
    return {}


def max_seq_length(transformer: Path, configured: int | None) -> int:
    """The length ST truncates to: the module's max_seq_length, else the tokenizer's limit, within the position table.

    (ST itself does not cap a configured max_seq_length; a text longer than the positions fails there.)
    """
    config_file = transformer / HF_CONFIG_FILE
    positions = int(read_json(config_file).get("max_position_embeddings", 512))
    if not configured and (transformer / TOKENIZER_CONFIG_FILE).is_file():
        limit = read_json(transformer / TOKENIZER_CONFIG_FILE).get("model_max_length")
        configured = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit < UNKNOWN_MAX_LENGTH else None
    if not isinstance(configured, int) or isinstance(configured, bool) or configured < 2:
        return positions
    return min(configured, positions)


def check_model_type(settings: dict, settings_file: Path) -> None:
    kind = settings.get("model_type", "SentenceTransformer")
    if kind != "SentenceTransformer":
        raise ValueError(f"{settings_file}: model_type {kind!r} is not a SentenceTransformer (dense sentence "
                         "vectors); bertforge does not reproduce it")


def read_json(path: Path) -> Any:
    """A JSON file's value (an object, except modules.json's list), or ValueError naming the file."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}); re-save the model") from None
    if not isinstance(value, list if path.name == MODULES_FILE else dict):
        raise ValueError(f"{path} holds a JSON {type(value).__name__}, not the "
                         f"{'list' if path.name == MODULES_FILE else 'object'} expected; re-save the model")
    return value


def model_fingerprint(folder: str | os.PathLike) -> str:
    """sha256 over the bytes of a checkpoint's FINGERPRINT_FILES and *.safetensors weights in `folder` (a
    ModelFolder's `transformer`): the one identity of a model in resumable work (an index's chunks, embed's
    parts, a training run's init_from), so a model retrained in place under the same folder name is told apart."""
    folder = Path(folder)
    digest = hashlib.sha256()
    names = sorted({*FINGERPRINT_FILES, *(path.name for path in folder.glob("*.safetensors"))})
    for name in names:
        path = folder / name
        if path.is_file():
            digest.update(name.encode())
            with open(path, "rb") as file:
                while block := file.read(1 << 20):
                    digest.update(block)
    return digest.hexdigest()
