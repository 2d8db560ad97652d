"""Fill-mask: the top-k vocabulary entries for each [MASK] in a text."""
from __future__ import annotations

import torch

from ...models.heads import BertForMaskedLM, BertForPreTraining


@torch.inference_mode()
def fill_mask(model: BertForMaskedLM | BertForPreTraining, tokenizer, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
    """For each [MASK] in `text`, in order, the top_k (token, probability) pairs.

    Raises ValueError when the text has no [MASK] token.
    """
    encoding = tokenizer(text, return_tensors="pt", truncation=True)
    input_ids = encoding["input_ids"]
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
