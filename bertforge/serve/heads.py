"""The head models a server holds: fill-mask and SPLADE vectors (an MLM head), classifier and
reranker (a BertForSequenceClassification). Each runs packed on the model thread (`passes`)."""
from __future__ import annotations

import numpy as np
import torch

from ..embeddings.embed import eval_mode
from ..engine.batching import TokenBatch
from ..engine.prepacked_linear import prepack_where_it_pays
from ..models.packed_forward import packed_forward
from ..models.folder import ModelFolder
from ..models.heads import BertForMaskedLM, BertForSequenceClassification
from ..tasks.classification.labels import shown_scores
from ..tasks.finetune import prediction_task
from ..tokenization.folder import load_tokenizer
from .passes import Tokens, run_in_passes

# Padded tokens per forward pass of a head: the CPU budget `Embedder` found fastest for MiniLM.
HEAD_PASS_TOKENS = 2048


class HeadModel:
    """A head checkpoint on a device, its tokenizer (event loop side), its own length limit and packed passes over
    inputs. folder: the checkpoint as `read_model_folder` reads it, as for the embedding model."""

    def __init__(self, model: torch.nn.Module, folder: ModelFolder, name: str, device: torch.device | None):
        self.name = name
        self.max_length = folder.max_seq_length  # a classifier of 128 positions beside a 512-token embedder
        self.model = model.to(device or "cpu").eval()
        self.device = next(self.model.parameters()).device
        # The server's own model, for inference only (engine/prepacked_linear.py); the encoder alone: the MLM head
        prepack_where_it_pays(self.model.bert)  # reads its tied decoder's weight itself
        self.tokenizer = load_tokenizer(folder)

    def run(self, run_pass, inputs: list[Tokens], extras: list | None = None) -> list:
        with torch.inference_mode(), eval_mode(self.model):
            return run_in_passes(lambda batch, rows: run_pass(batch.to(self.device), rows), inputs,
                                 self.tokenizer.pad_token_id, HEAD_PASS_TOKENS, extras)


class MaskedLanguageModel(HeadModel):
    """Fill-mask (the top-k tokens for each [MASK]) and SPLADE sparse vectors, from one MLM head."""

    def __init__(self, folder: ModelFolder, name: str, device: torch.device | None = None):
        super().__init__(BertForMaskedLM.from_pretrained(folder.transformer), folder, name, device)

    def real_states(self, batch: TokenBatch) -> torch.Tensor:
        """The last layer at the real tokens, row by row: (tokens, hidden)."""
        states = packed_forward(self.model.bert, batch).last_hidden_state  # (batch, seq, hidden)
        return states[batch.attention_mask.bool()]

    def fill(self, inputs: list[Tokens], top_k: list[int]) -> list[list[list[tuple[int, float]]]]:
        """Per input, per [MASK] in order, its top_k (token id, probability) pairs (model thread)."""
        return self.run(self.fill_pass, inputs, top_k)

    def fill_pass(self, batch: TokenBatch, top_k: list[int]) -> list:
        masks = batch.input_ids[batch.attention_mask.bool()] == self.tokenizer.mask_token_id  # (tokens,)
        logits = self.model.cls.predictions(self.real_states(batch)[masks]).float()  # (masks, vocab): masks only
        probabilities = logits.softmax(dim=-1).cpu()
        per_input = batch.input_ids.eq(self.tokenizer.mask_token_id).logical_and(batch.attention_mask.bool()).sum(1)
        results, start = [], 0
        for count, k in zip(per_input.tolist(), top_k):
            best = probabilities[start:start + count].topk(k, dim=-1)
            results.append([list(zip(i.tolist(), p.tolist())) for i, p in zip(best.indices, best.values)])
            start += count
        return results

    def sparse(self, inputs: list[Tokens]) -> list[dict[int, float]]:
        """SPLADE: per input, max over its tokens of log(1 + relu(MLM logits)); {vocab id: weight > 0}."""
        return self.run(lambda batch, _: self.sparse_pass(batch), inputs)

    def sparse_pass(self, batch: TokenBatch) -> list[dict[int, float]]:
        weights = torch.log1p(torch.relu(self.model.cls.predictions(self.real_states(batch)).float()))  # (tokens, vocab)
        lengths = batch.attention_mask.sum(dim=1).tolist()
        results = []
        for row_weights in weights.split(lengths):
            pooled = row_weights.max(dim=0).values.cpu()
            nonzero = pooled.nonzero().squeeze(1)
            results.append(dict(zip(nonzero.tolist(), pooled[nonzero].tolist())))
        return results


class SequenceClassifier(HeadModel):
    """A fine-tuned BertForSequenceClassification: per input (a text or a pair), its logits."""

    def __init__(self, folder: ModelFolder, name: str, device: torch.device | None = None):
        model = BertForSequenceClassification.from_pretrained(folder.transformer)
        super().__init__(model, folder, name, device)
        # The length it was trained to read, as `predict` and `search --rerank` read it (task.json's; for a folder
        # fine-tuned elsewhere its own max_seq_length), not the folder's position table: a classifier fine-tuned at
        # 128 tokens read 256 of a text here beside MiniLM.
        task, _ = prediction_task(folder, tokenizer=self.tokenizer)
        self.task = task  # how `predict` reads a long text (windows) and combines its windows' scores
        self.max_length = task.max_length
        config = model.config
        self.labels = [(config.id2label or {}).get(i, f"LABEL_{i}") for i in range(config.num_labels)]
        self.output = task.labels.output  # what its logits are shown as, as predict shows them (output_function)

    def logits(self, inputs: list[Tokens]) -> list[np.ndarray]:
        """Float32 (num_labels,) logits per input (model thread)."""
        return self.run(lambda batch, _: self.logits_pass(batch), inputs)

    def logits_pass(self, batch: TokenBatch) -> list[np.ndarray]:
        input_ids, token_type_ids, attention_mask = batch.tensors()
        output = self.model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                            packing=batch.packing)
        return list(output.logits.float().cpu().numpy())

    def windows(self, texts: list[str], limit: int) -> tuple[list[Tokens], list[int]]:
        """Texts read as `bertforge predict` reads them (tokenizer thread): a text longer than `limit` tokens in
        the task's overlapping windows of `limit`. Returns the windows' tokens and the text each window reads."""
        read = self.task.windows([(text,) for text in texts], limit)
        return [Tokens(ids) for ids in read.input_ids], read.document_index

    def combined(self, logits: list[np.ndarray], owners: list[int], count: int) -> list[np.ndarray]:
        """Per text, its windows' logits shown and combined as `predict` combines them (the task's data.combine)."""
        scores = self.task.combined_scores(np.stack(logits), owners, count)
        return list(scores.reshape(count, -1))  # regression's (texts,) values as one score per text

    def scores(self, logits: np.ndarray) -> np.ndarray:
        """Logits -> what the classifier means (`output_function`): softmax, sigmoid (multi-label, or one label
        without problem_type) or raw (regression)."""
        return shown_scores(logits, self.output)
