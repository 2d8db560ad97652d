"""TSDAE (Wang et al. 2021): a sentence encoder trained to be the bottleneck of a denoising auto-encoder.

A text loses most of its words (`delete_words`: 60% of them, the paper's best noise); the encoder
turns what is left into one vector; a decoder (`models.decoder.BertDecoder`, the encoder's own
weights plus cross-attention to that vector) must write the original text back token by token.
The loss is the decoder's cross-entropy on the original's tokens, as sentence-transformers'
DenoisingAutoEncoderLoss computes it with tie_encoder_decoder (tests/test_tsdae.py: equal on the
same weights). Only the encoder ships: `DenoisingAutoEncoder` saves as the BiEncoder it is, and
the decoder's own weights travel in training checkpoints only (`training_only_state_dict`).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ...embeddings.folder_vectors import with_prompt
from ...models.decoder import BertDecoder
from ...models.folder import ModelFolder, read_model_folder
from ...models.heads import IGNORE_INDEX
from ...models.model import BertModel
from .bi_encoder import BiEncoder, BiEncoderOutput

DELETION_RATIO = 0.6
# Words (inner hyphens and apostrophes kept) and punctuation marks, each a unit the noise may delete,
# close to how sentence-transformers' nltk word_tokenize splits; BERT's tokenizer splits punctuation
# off anyway, so joining what is kept with spaces gives the pieces a detokenizer would.
WORD = re.compile(r"\w+(?:[-']\w+)*|[^\w\s]")


def delete_words(text: str, rng: np.random.Generator, ratio: float = DELETION_RATIO) -> str:
    """`text` with each word deleted with probability `ratio`, at least one kept (sentence-transformers'
    DenoisingAutoEncoderDataset.delete); a text without words comes back as it is."""
    words = WORD.findall(text)
    if not words:
        return text
    keep = rng.random(len(words)) > ratio
    if not keep.any():
        keep[rng.integers(len(words))] = True
    return " ".join(word for word, kept in zip(words, keep) if kept)


class DenoisingCollator:
    """Text indices -> DenoisingAutoEncoder's forward arguments: each text damaged, and the text itself.

    The deletions depend on (seed, the batch's indices): a resumed run rebuilds the batch it would have had.
    prompt: the model's default prompt, put whole before each damaged text (`with_prompt`, counted in max_length),
    which the encoder embeds as `embed` will; the decoder writes back the text alone (the prompt, the same in every
    text, is nothing to learn from the vector).
    """

    def __init__(self, texts: list[str], tokenizer, max_length: int, seed: int = 0, ratio: float = DELETION_RATIO,
                 prompt: str = ""):
        self.texts, self.tokenizer, self.max_length, self.seed, self.ratio = texts, tokenizer, max_length, seed, ratio
        self.prompt = prompt

    def __len__(self) -> int:
        return len(self.texts)

    def __call__(self, indices: list[int]) -> dict[str, Tensor]:
        rng = np.random.default_rng([self.seed, *indices])
        texts = [self.texts[i] for i in indices]
        noisy = self.encode([with_prompt(self.prompt, delete_words(text, rng, self.ratio)) for text in texts])
        original = self.encode(texts)
        return {"noisy_input_ids": noisy["input_ids"], "noisy_attention_mask": noisy["attention_mask"],
                "input_ids": original["input_ids"], "attention_mask": original["attention_mask"]}

    def encode(self, texts: list[str]):
        return self.tokenizer(texts, truncation=True, max_length=self.max_length, padding=True, return_tensors="pt")


class DenoisingAutoEncoder(BiEncoder):
    """A BiEncoder (what is saved, evaluated and shipped) with a BertDecoder tied to it, for training.

    forward(noisy text, original text) -> the decoder's loss on the original's tokens given the
    noisy text's sentence vector (pooled as the encoder pools, normalised if it normalises).
    """

    def __init__(self, bert: BertModel, *args, **options):
        super().__init__(bert, *args, **options)
        self.decoder = BertDecoder(bert)

    def forward(self, noisy_input_ids: Tensor, noisy_attention_mask: Tensor, input_ids: Tensor,
                attention_mask: Tensor) -> BiEncoderOutput:
        """(batch, seq) ids and masks of the damaged and the original texts -> the reconstruction loss."""
        vectors = self.sentence_vectors(noisy_input_ids, noisy_attention_mask)  # (batch, hidden)
        # The decoder reads the original up to each position and predicts the next token; padding counts for nothing.
        labels = input_ids[:, 1:].masked_fill(attention_mask[:, 1:] == 0, IGNORE_INDEX)
        _, loss = self.decoder(self.bert, input_ids[:, :-1], vectors[:, None], labels)
        return BiEncoderOutput(loss)

    def training_only_state_dict(self) -> dict[str, Tensor]:
        """The decoder's own weights: not part of the model that ships, but of the training state (the loop's
        checkpoints keep them beside the optimizer's, so a resumed run goes on with the same decoder)."""
        return self.decoder.own_state_dict()

    def load_training_only_state_dict(self, state: dict[str, Tensor]) -> None:
        missing, unexpected = self.decoder.load_state_dict(state, strict=False)
        missing = [key for key in missing if key not in self.decoder.tied_keys]
        if missing or unexpected:
            raise ValueError(f"the checkpoint's decoder weights do not fit this model (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]})")

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike | ModelFolder, **options) -> "DenoisingAutoEncoder":
        """BiEncoder.from_pretrained, and the decoder's head from the checkpoint when it has an MLM head (as
        sentence-transformers' decoder, loaded from the same checkpoint, would); else a fresh one."""
        folder = path if isinstance(path, ModelFolder) else read_model_folder(path)
        model = super().from_pretrained(folder, **options)
        with torch.no_grad():
            model.decoder.load_head(Path(folder.transformer))
        return model
