"""The embedding model a server holds: sentence vectors and token vectors, computed packed on the model thread.

Its tokenizer (`tokenizer`) is for the tokenizer thread's side; the Embedders have their own
instance for the explorer's model-thread work: a BertTokenizer call sets its engine's
truncation and padding, so one instance must never be used by two threads at once.
"""
from __future__ import annotations

import numpy as np
import torch

from ..embeddings.embed import Embedder, eval_mode
from ..embeddings.options import WORD_LAYER_CHOICES, fits
from ..engine.batching import TokenBatch
from ..engine.prepacked_linear import prepack_where_it_pays
from ..models.packed_forward import packed_forward
from ..models.folder import ModelFolder
from ..models.model import BertModel
from ..tokenization.folder import load_tokenizer
from .passes import Tokens, run_in_passes



class EmbeddingModel:
    """Sentence vectors: the encoder and pooling of `bertforge.embed`, run on pre-tokenized inputs."""

    def __init__(self, folder: ModelFolder, name: str, pooling: str, device: torch.device | None = None,
                 dtype: str | None = None, cuda_graphs: bool = True):
        """folder: as `models.folder.read_model_folder` read it; its max length and tokenizer (lower-casing
        as its sentence-transformers config says) are used; pooling is the folder's unless an option overrides it.
        The prompts are the server's to add (`inputs.InputEncoder`), so the Embedders here have none.
        cuda_graphs: replay the sentence vectors' passes from CUDA graphs where the model is on a GPU (the
        Embedder's default there); False runs them eagerly."""
        self.name, self.folder = name, folder
        encoder = BertModel.from_pretrained(folder.transformer).to(device or "cpu")
        self.tokenizer = load_tokenizer(folder)  # tokenizer thread
        worker_tokenizer = load_tokenizer(folder)  # model thread (explorer)
        max_length = folder.max_seq_length
        self.pooling = pooling
        # dtype (fp16/bf16 weights, int8) is for the sentence vectors; the explorer's word vectors stay float32.
        self.embedder = Embedder(encoder, worker_tokenizer, pooling=pooling, max_length=max_length, dtype=dtype,
                                 cuda_graphs=None if cuda_graphs else False)
        if self.embedder.graphs is not None:  # every shape a pass can take, before the first request
            with torch.inference_mode(), eval_mode(self.embedder.model):
                self.embedder.graphs.capture_all(max_length)
        # Word vectors are read from a plain forward pass, never from the graphed sentence passes; a choice the model
        # is too shallow for (last_four_mean on 2 layers) is left out.
        self.word_embedders = {layers: Embedder(encoder, worker_tokenizer, layers=layers, max_length=max_length,
                                                cuda_graphs=False)
                               for layers in WORD_LAYER_CHOICES if fits(layers, encoder.config.num_hidden_layers)}
        # The explorer's attention maps come from the same float32 encoder as its word vectors: they show the
        # checkpoint's own attention, which an int8 pass moves by up to 0.06.
        self.explorer_embedder = self.word_embedders["last"]
        # The encoder is the server's own, loaded here for inference: prepacked after the embedders are made (an
        # int8 or half copy is made from the plain linear layers), it serves the float32 passes of all of them.
        prepack_where_it_pays(encoder)

    @property
    def max_length(self) -> int:
        return self.embedder.max_length

    @property
    def dim(self) -> int:
        return self.embedder.dim

    def run(self, run_pass, inputs: list[Tokens]) -> list:
        embedder = self.embedder
        with torch.inference_mode(), eval_mode(embedder.model):
            return run_in_passes(lambda batch, _: run_pass(batch.to(embedder.device)), inputs,
                                 self.tokenizer.pad_token_id, embedder.max_batch_tokens)

    def pooled(self, inputs: list[Tokens]) -> list[np.ndarray]:
        """Inputs -> pooled, unnormalised float32 vectors (dim,), one per input (model thread)."""
        return self.run(lambda batch: list(self.embedder.pooled(batch).cpu().numpy()), inputs)

    def token_states(self, inputs: list[Tokens]) -> list[np.ndarray]:
        """Inputs -> the last layer's float32 vectors (tokens, hidden) per input, [CLS] and [SEP] included."""
        return self.run(self.last_layer, inputs)

    def last_layer(self, batch: TokenBatch) -> list[np.ndarray]:
        states = packed_forward(self.embedder.model, batch).last_hidden_state.float().cpu().numpy()
        lengths = batch.attention_mask.sum(dim=1).tolist()
        return [states[row, :length] for row, length in enumerate(lengths)]
