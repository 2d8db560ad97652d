"""What a tokenizer call gives back: `Encoding` (model inputs under transformers' key names, with
the engine's word and sequence ids on demand) and the lists-to-tensors step of return_tensors."""
from __future__ import annotations


class Encoding(dict):
    """What `BertTokenizer.__call__` returns: model inputs under transformers' key names.

    input_ids, token_type_ids, attention_mask (+ offset_mapping, special_tokens_mask when asked):
    lists for one text, lists of lists for a batch, or tensors (batch, seq) [offsets (batch, seq, 2)]
    with return_tensors. `enc.input_ids` works as well as `enc["input_ids"]`.
    """

    def __init__(self, data: dict, encodings: list):
        super().__init__(data)
        self._encodings = encodings  # the engine's, one per text: word and sequence ids on demand

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def word_ids(self, batch_index: int = 0) -> list[int | None]:
        """Per token, the index of the word it came from (None for special and padding tokens).

        Words are numbered per sequence, so the second text of a pair counts from 0 again.
        """
        return self._encodings[batch_index].word_ids

    def sequence_ids(self, batch_index: int = 0) -> list[int | None]:
        """Per token, 0 for the first text, 1 for text_pair, None for special and padding tokens."""
        return self._encodings[batch_index].sequence_ids

    def to(self, device) -> "Encoding":
        """Move tensor values to a device (return_tensors="pt" only)."""
        return Encoding({key: value.to(device) for key, value in self.items()}, self._encodings)


def as_tensors(data: dict, return_tensors: str) -> dict:
    """Lists of lists -> (batch, seq) tensors; raises ValueError when lengths differ."""
    lengths = {len(row) for row in data["input_ids"]}
    if len(lengths) > 1:
        raise ValueError(f"cannot make tensors from sequences of lengths {sorted(lengths)}; "
                         "pass padding=True (or padding='max_length') with return_tensors")
    if return_tensors == "np":
        import numpy as np

        return {key: np.array(value, dtype=np.int64) for key, value in data.items()}
    import torch

    return {key: torch.tensor(value, dtype=torch.long) for key, value in data.items()}
