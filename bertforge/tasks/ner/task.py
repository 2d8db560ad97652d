"""Token classification (NER) from CoNLL files: labels on first sub-tokens, predictions per word, seqeval F1."""
from __future__ import annotations

import logging
from functools import lru_cache, partial
from pathlib import Path

import torch

from ...train.batches import predict_rows
from .conll import TaggedFeatures, TaggedSentence, check_entity_tags, encode_for_tagging, pad_batch, read_conll, \
    tag_set, words_from_logits, write_conll
from ...models.heads import BertForTokenClassification
from ..metrics import ner_metrics
from .schemes import scored_as_bilou
from .. import STANDARD_MAX_LENGTH, Rows, TaskSettings
from ..records import write_records

logger = logging.getLogger("bertforge")


class NerTask:
    model_class = BertForTokenClassification
    default_metric = "f1"  # entity-level, as the CoNLL script (and every NER table) reports

    def __init__(self, settings: TaskSettings, tokenizer, config=None):
        self.settings, self.tokenizer = settings, tokenizer
        self.max_length = settings.max_length or STANDARD_MAX_LENGTH["ner"]
        self._sentences = lru_cache(maxsize=None)(self._read)
        if config is not None:
            if not config.id2label:
                raise ValueError("the model config has no id2label: fine-tune it for NER first")
            self.tags = [config.id2label[i] for i in range(len(config.id2label))]
        else:
            self.tags = tag_set(self._sentences("train"))
        self.label2id = {tag: index for index, tag in enumerate(self.tags)}
        self._features = lru_cache(maxsize=None)(self._encode)

    def config_overrides(self) -> dict:
        return {"num_labels": len(self.tags), "id2label": dict(enumerate(self.tags)), "label2id": self.label2id}

    def training_rows(self) -> Rows:
        features = self._features("train")
        return Rows(len(features), partial(pad_batch, features))

    def evaluate(self, model, split: str, batch_size: int = 64, device=torch.device("cpu")) -> dict[str, float]:
        """Entity precision/recall/F1 (seqeval) and token accuracy over the words of data.<split>.

        Gold tags the model has no label for (a type too rare to reach the training split)
        count as missed entities, as they would in any NER table; a warning names them.
        """
        sentences = self._sentences(split)
        unseen = sorted({tag for sentence in sentences for tag in sentence.tags} - set(self.label2id))
        if unseen:
            logger.warning("%s: tags %s never occur in training; the model cannot predict them", split, unseen)
        try:  # every tag of the model and the file (scored together), checked before predicting
            scored_as_bilou([*self.tags, *unseen])
        except ValueError as error:
            raise ValueError(f"{getattr(self.settings, split)} and the model's labels: {error}") from None
        predicted = self.predict_tags(model, self._features(split), batch_size, device)
        return ner_metrics([sentence.tags for sentence in sentences], predicted)

    def predict_tags(self, model, features: TaggedFeatures, batch_size: int, device) -> list[list[str]]:
        logits = predict_rows(model, [len(ids) for ids in features.input_ids], partial(pad_batch, features),
                              batch_size=batch_size, per_token=True, device=device)
        return words_from_logits(features, logits, dict(enumerate(self.tags)))

    def predict_file(self, model, input_path: str, output_path: str, batch_size: int = 64,
                     device=torch.device("cpu")) -> int:
        """Tag every word of a CoNLL file (its tag column, if any, is ignored).

        Writes CoNLL (word, tag) to a .conll/.txt output, else one record per sentence.
        """
        sentences = read_conll(input_path)
        check_entity_tags(sentences, input_path)
        tags = self.predict_tags(model, encode_for_tagging(self.tokenizer, sentences, None, self.max_length),
                                 batch_size, device)
        if Path(output_path).suffix in (".conll", ".txt"):
            write_conll([TaggedSentence(s.words, t, s.line) for s, t in zip(sentences, tags)], output_path)
        else:
            write_records([{"line": s.line, "words": s.words, "tags": t} for s, t in zip(sentences, tags)],
                          output_path)
        return len(sentences)

    def _read(self, split: str) -> list[TaggedSentence]:
        path = getattr(self.settings, split)
        if not path:
            raise ValueError(f"no data.{split} file given")
        sentences = read_conll(path)
        if any(sentence.tags is None for sentence in sentences):
            raise ValueError(f"{path} has no tag column; training and evaluation need word<TAB>tag lines")
        check_entity_tags(sentences, path)
        return sentences

    def _encode(self, split: str) -> TaggedFeatures:
        # Only training needs label ids; evaluation compares tag strings, so an unseen gold tag is fine.
        label2id = self.label2id if split == "train" else None
        return encode_for_tagging(self.tokenizer, self._sentences(split), label2id, self.max_length)
