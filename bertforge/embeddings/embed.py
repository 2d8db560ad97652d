"""Sentence, word and token vectors from a BERT encoder.

`Embedder` holds a model, its tokenizer and the choices that shape a vector (which
hidden layers, how they are combined, how tokens are pooled); `embed`, `word_vector`
and `token_vectors` (one_call.py) are one-call wrappers around it.

Sentence vectors go through the inference engine (`bertforge.engine`): texts are tokenized
in windows in a background thread, sorted by token count and cut into batches of at most
`max_batch_tokens` padded tokens (and `batch_size` texts); the model runs on the real tokens
only (no padding through the layers), and vectors come back in the caller's order.

Hidden states are indexed as in `EncoderOutput.hidden_states`: 0 is the embedding
layer's output, 1..N the encoder layers, -1 the last.
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
import weakref
from typing import Callable, Iterable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from ..engine.batching import TokenBatch, collate, fit_to_budget, plan_batches, tokenize_windows
from ..engine.cuda_graphs import GraphedPasses
from ..models.packed_forward import packed_forward
from ..engine.devices import device_from_option
from ..errors import UsageError
from ..engine.pipeline import HostResults, prefetched
from ..engine.prepacked_linear import prepack_where_it_pays
from ..engine.precision import check_inference_dtype, in_dtype
from ..engine.threads import thread_governor
from ..engine.workers import run_in_workers, worth_workers
from ..models.folder import ModelFolder, check_prompt_pooled, read_model_folder
from .folder_vectors import folder_options, with_prompt
from ..models.model import BertModel
from ..models.outputs import EncoderOutput
from ..tokenization.folder import load_tokenizer
from ..validation import checked
from .options import LayerSpec, check_max_length, check_sentence, check_texts, resolve_encoder, resolve_layers
from .pooling import pool, pooling_modes
from .words import find_word, spans_pieces

# With more texts than this, `progress=None` shows a progress bar.
AUTO_PROGRESS_TEXTS = 512
# Padded tokens per batch when max_batch_tokens is not given. CPU: all-MiniLM-L6-v2 on 1 core ran
# 2,048-token batches as fast as 4,096 and 8,192 (and 16,384 slower: the (tokens, 4 x hidden)
# feed-forward activations leave the cache). CUDA: text-embeddings-inference's default.
DEFAULT_MAX_BATCH_TOKENS = {"cpu": 2048, "cuda": 16384}


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
    """Dropout off while embedding, and the caller's train/eval mode given back afterwards.

    A model already in eval mode throughout is left alone: `train()` walks and sets every module, a
    millisecond a call for MiniLM (a sixth of the time to embed one short text, and host time a GPU waits on).
    """
    if not any(module.training for module in model.modules()):
        yield
        return
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


class Embedder:
    """A model, its tokenizer and the vector choices, reusable across many `encode` calls.

    layers: an int (-1 last, -2 second to last, 0 the embedding layer's output), a list
        of ints combined by `layer_combine` ("mean" by default, or "concat"), or an alias:
        "last", "second_to_last", "last_four_mean", "last_four_concat"; None: a word vector's default
        (options.DEFAULT_WORD_LAYERS, the mean of the last four; the last layer on a model with fewer than three).
    pooling: "mean" (over real tokens, as sentence-transformers; the default), "max" (over real
        tokens), "cls" (the [CLS] vector), "pooler" (the model's pooler_output; last layer only),
        sentence-transformers' "mean_sqrt_len_tokens", "weightedmean", "lasttoken", or several
        modes joined by "+", their vectors concatenated in the order named: "mean+cls" is [mean | cls], as
        sentence-transformers 6's Pooling(pooling_mode=["mean", "cls"]) (`pooling.pooling_modes`).
    normalize: L2-normalise sentence vectors (then a dot product is the cosine); default no.
    prompt: text put before every text it reads (encode, token and word vectors): a folder's default prompt; "".
    batch_size: the most texts in one forward pass.
    max_batch_tokens: the most padded tokens (texts x the longest) in one forward pass; default 2,048 on a CPU,
        16,384 on a GPU. A text longer than this is truncated to it, with a warning.
    threads: "auto" chooses the CPU thread count batch by batch (engine/governor.py: the usable cores or
        fewer, whichever runs faster on the machine as it is now; torch's own count is given back after
        each `encode`). None (the default) runs at torch's current count, except in a `bertforge` command
        run without --threads, which chooses as "auto" does. An `encode` of at least two batches per
        thread shares its batches among single-threaded workers instead, one per usable core ("auto") or
        per torch thread (engine/workers.py).
    max_length: truncation in tokens; default the tokenizer's limit, capped at the model's position table.
    progress: True/False to force a tqdm bar on or off; None shows one for long inputs.
    device: where to run; the model is moved there. Default: where the model already is (`from_pretrained`, which
        loads it: the GPU when there is one, as the commands choose).
    dtype: the number format the model runs in: torch.float32 (None), torch.float16 or
        torch.bfloat16 (the weights themselves are converted), or torch.qint8 (int8 weights and
        activations in every linear layer; CPU only); the names "fp32", "fp16", "bf16", "int8"
        work too. A model in another format is converted as a copy, so the caller's is left
        as it was. Vectors are always returned as float32.
    cuda_graphs: replay each pass from a CUDA graph (engine/cuda_graphs.py: one launch a pass, the
        inputs padded to a few fixed shapes). Default: on where the model is on a GPU; True elsewhere
        is a ValueError.

    `pooling` and `normalize` shape `encode`'s sentence vectors only; `word_vector` and
    `token_vectors` use the same layers but return unpooled, unnormalised vectors.
    Raises ValueError for any invalid choice, naming the valid ones.
    """

    def __init__(self, model, tokenizer, *, layers: LayerSpec | None = -1, layer_combine: str | None = None,
                 pooling: str | None = None, normalize: bool | None = None, batch_size: int = 32,
                 max_length: int | None = None, progress: bool | None = None,
                 device: str | torch.device | None = None, dtype: torch.dtype | str | None = None,
                 max_batch_tokens: int | None = None, prompt: str = "", threads: str | None = None,
                 cuda_graphs: bool | None = None):
        encoder = resolve_encoder(model)
        if tokenizer is None:
            raise ValueError(
                "tokenizer is required with a model object (the model does not know its vocabulary): "
                "pass tokenizer=BertTokenizer.from_pretrained(folder), or pass the checkpoint folder instead"
            )
        self.tokenizer = tokenizer
        num_layers = encoder.config.num_hidden_layers
        self.layers, self.layer_combine = resolve_layers(layers, layer_combine, num_layers)
        self.pooling = pooling or "mean"
        if self.pooling == "pooler":
            self.check_pooler_allowed(encoder, num_layers)
        self.num_modes = 1 if self.pooling == "pooler" else len(pooling_modes(self.pooling))
        self.normalize = bool(normalize)
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a str, got {type(prompt).__name__}")
        self.prompt = prompt
        self.batch_size = checked("batch_size", batch_size)
        self.max_length = check_max_length(max_length, tokenizer, encoder)
        self.progress = progress
        self.dtype = check_inference_dtype(dtype)
        if device is not None:
            encoder.to(device)
        self.model = in_dtype(encoder, self.dtype, inplace=False)
        self.device = next(self.model.parameters()).device
        if max_batch_tokens is None:
            max_batch_tokens = DEFAULT_MAX_BATCH_TOKENS.get(self.device.type, DEFAULT_MAX_BATCH_TOKENS["cuda"])
        self.max_batch_tokens = checked("max_batch_tokens", max_batch_tokens)
        governor = thread_governor(threads)  # checks `threads` on every device; only the CPU's count is chosen
        self.governor = governor if self.device.type == "cpu" else None
        if cuda_graphs is None:
            cuda_graphs = self.device.type == "cuda"
        self.graphs = graphed_passes(self) if cuda_graphs else None

    def check_pooler_allowed(self, encoder: BertModel, num_layers: int) -> None:
        if self.layers != (num_layers,):
            raise UsageError("pooling='pooler' reads the last layer's [CLS]; use it with layers=-1, or pick 'cls'")
        if encoder.pooler is None:
            raise ValueError("this model has no pooler (it was built without one); use pooling='cls' or 'mean'")

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike | ModelFolder, tokenizer=None, **options) -> "Embedder":
        """Load BertModel (and BertTokenizer, unless given) from a checkpoint folder; options as in `Embedder`.

        pooling, normalize, max_length and prompt left out (or None) follow the folder
        (`read_model_folder`): a sentence-transformers folder's Pooling, Normalize, max_seq_length
        (256 for all-MiniLM-L6-v2) and default prompt, so the vectors are `SentenceTransformer.encode`'s;
        a plain checkpoint's are mean pooling, unnormalised, its tokenizer's limit. device left out is the
        commands' default (`engine.devices.device_from_option`): this process's GPU when there is one, else the CPU.
        """
        folder = path if isinstance(path, ModelFolder) else read_model_folder(path)
        for name, value in folder_options(folder).items():  # max_length 0 is the default too (--max-length's)
            if options.get(name) is None or (name == "max_length" and options[name] == 0):
                options[name] = value
        check_prompt_pooled(folder, options.get("prompt") or "", "prompt")
        dtype = check_inference_dtype(options.get("dtype"))
        if options.get("device") is None:  # as every command and SentenceTransformer choose: the GPU if there is one
            options["device"] = torch.device("cpu") if dtype == torch.qint8 else device_from_option(None)  # int8: CPU
        # Converted here, in place: the freshly loaded model is ours, so no float32 copy is kept.
        model = in_dtype(BertModel.from_pretrained(folder.transformer), dtype, inplace=True)
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(folder)
        embedder = cls(model, tokenizer, **options)
        prepack_where_it_pays(embedder.model)  # ours, for inference only (a model passed in may train on)
        return embedder

    @property
    def dim(self) -> int:
        """Length of each returned vector: hidden size, times the number of layers when concatenated."""
        hidden = self.model.config.hidden_size * self.num_modes
        return hidden * len(self.layers) if self.layer_combine == "concat" else hidden

    @property
    def wants_hidden_states(self) -> bool:
        return self.layers != (self.model.config.num_hidden_layers,)

    # --- sentence vectors ------------------------------------------------------------------

    def encode(self, texts: Iterable[str], on_rows: Callable[[int], None] | None = None) -> np.ndarray:
        """texts -> float32 array (len(texts), dim), row i for texts[i].

        on_rows(count) is told of the rows as they are written (a caller's own progress bar over several calls).
        Raises ValueError when texts is a single str or holds a non-str item.
        """
        texts = check_texts(texts)
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        show = self.progress if self.progress is not None else len(texts) > AUTO_PROGRESS_TEXTS
        with tqdm(total=len(texts), unit="text", disable=not show) as bar:
            def written(count: int) -> None:
                bar.update(count)
                if on_rows is not None:
                    on_rows(count)

            results = HostResults(vectors, on_written=written)
            workers = self.cpu_workers()
            if worth_workers(workers, batches=math.ceil(len(texts) / self.batch_size)):
                self.encode_in_workers(texts, results, workers)
            else:
                with torch.inference_mode(), eval_mode(self.model), self.thread_session() as governor:
                    for batch in prefetched(self.batches(texts)):
                        with governor.run(batch.num_tokens) if governor else contextlib.nullcontext():
                            results.add(batch.rows, self.pooled(batch.to(self.device, non_blocking=True)))
            results.finish()
        return vectors

    def cpu_workers(self) -> int:
        """How many single-threaded workers a long `encode` shares its batches among (engine/workers.py): on the
        CPU, one per thread it would otherwise run on (the usable cores when the count is chosen); else 1."""
        if self.device.type != "cpu" or self.graphs is not None:
            return 1
        return self.governor.counts[-1] if self.governor else torch.get_num_threads()

    def encode_in_workers(self, texts: list[str], results: HostResults, workers: int) -> None:
        """`encode`'s batches, each pooled by whichever worker is free, written to `results` in the texts' order."""
        written = threading.Lock()

        def pool_batch(batch: TokenBatch) -> None:
            vectors = self.pooled(batch)
            with written:
                results.add(batch.rows, vectors)

        with eval_mode(self.model), contextlib.closing(prefetched(self.batches(texts))) as batches:
            run_in_workers(batches, pool_batch, workers)  # closing: a worker's error stops the tokenizer's thread too

    def thread_session(self):
        """The governor's session for one `encode` (it yields None where the thread count is not chosen here)."""
        return self.governor.session() if self.governor else contextlib.nullcontext()

    def batches(self, texts: list[str]) -> Iterator[TokenBatch]:
        """Token-budget batches covering texts (rows are positions in texts), a window at a time.

        Runs in `prefetched`'s thread: tokenizing, batching and (for a GPU) pinning the next
        batches while the model runs on the current one.
        """
        pin = self.device.type == "cuda"
        for start, end in tokenize_windows(len(texts)):
            window = self.prompted(texts[start:end])
            token_ids = self.tokenizer(window, truncation=True, max_length=self.max_length)["input_ids"]
            token_ids = fit_to_budget(token_ids, self.max_batch_tokens)
            for rows in plan_batches([len(ids) for ids in token_ids], self.max_batch_tokens, self.batch_size):
                batch = collate(token_ids, rows, self.tokenizer.pad_token_id)
                batch.rows = rows + start
                yield batch.pin_memory() if pin else batch

    def prompted(self, texts: list[str]) -> list[str]:
        """The texts as the model reads them (`with_prompt`), as SentenceTransformer.encode(prompt=...)."""
        return [with_prompt(self.prompt, text) for text in texts] if self.prompt else texts

    def token_count(self, text: str) -> int:
        """The tokens `encode` would give the model for `text` before truncation: prompt, [CLS] and [SEP] included."""
        return len(self.tokenizer(self.prompted([text]))["input_ids"][0])

    def pooled(self, batch: TokenBatch) -> Tensor:
        """One batch, already on the device -> (batch, dim) float32 sentence vectors, left on the device."""
        if self.graphs is not None:
            return self.graphs(*batch.tensors())
        # Pooling masks the padding: where packing would cost more than the padded tokens, they stay.
        output = packed_forward(self.model, batch, output_hidden_states=self.wants_hidden_states,
                                only_if_it_pays=True)
        return self.vectors(output, batch.attention_mask)

    def weight_addresses(self) -> tuple[int, ...]:
        return tuple(parameter.data_ptr() for parameter in self.model.parameters())

    def padded_vectors(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The padded pass's sentence vectors: what a CUDA graph records (no host sync, fixed shapes)."""
        output = self.model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                            output_hidden_states=self.wants_hidden_states)
        return self.vectors(output, attention_mask)

    def vectors(self, output: EncoderOutput, attention_mask: Tensor) -> Tensor:
        """A pass's output -> (batch, dim) float32 sentence vectors, pooled over the real tokens."""
        if self.pooling == "pooler":
            vectors = output.pooler_output.float()
        else:
            vectors = pool(self.layer_states(output), attention_mask, self.pooling)
        return F.normalize(vectors, p=2, dim=1) if self.normalize else vectors

    def sentence_vectors(self, batch: dict[str, Tensor] | TokenBatch) -> Tensor:
        """One padded tokenizer batch (input_ids, attention_mask[, token_type_ids]) -> (batch, dim) float32 on the CPU."""
        if not isinstance(batch, TokenBatch):
            batch = TokenBatch.from_padded(batch)
        with torch.inference_mode(), eval_mode(self.model):
            return self.pooled(batch.to(self.device)).cpu()

    # --- token and word vectors ------------------------------------------------------------

    def token_vectors(self, sentence: str) -> tuple[list[str], np.ndarray]:
        """One sentence -> (its tokens, float32 array (num_tokens, dim)), [CLS] and [SEP] included, and the prompt's
        tokens where the Embedder has one (as sentence-transformers' token_embeddings and the server's /embed_all).

        Raises ValueError when sentence is not a str.
        """
        encoded = self.tokenize(self.prompted([check_sentence(sentence)]))
        states = self.layer_states(self.forward(encoded))[0].cpu()  # (seq, dim)
        tokens = self.tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
        return tokens, states.numpy()

    def word_vector(self, sentence: str, word: str, occurrence: int = 0) -> np.ndarray:
        """The vector of `word` (a word or phrase) in `sentence`: float32 (dim,), the mean of its pieces.

        `word` is found as a whole word, case-insensitively; `occurrence` picks which match
        (0 the first, -1 the last). Its sub-word pieces are the tokens whose character
        offsets overlap the match, so the sentence is encoded as written (no [MASK]); words.py. The layers are
        this Embedder's (the last by default, as its sentence vectors); `bertforge.word_vector`, `senses` and the
        explorer take DEFAULT_WORD_LAYERS (the mean of the last four), which `Embedder(..., layers=None)` reads too.
        Raises ValueError when the word does not occur, `occurrence` is out of range, or the
        word falls (even partly) past the max_length truncation.
        """
        return self.span_vectors(sentence, [find_word(check_sentence(sentence), word, occurrence)])[0]

    def span_vectors(self, sentence: str, spans: list[tuple[int, int]]) -> np.ndarray:
        """float32 (len(spans), dim): per character span [start, end) of the sentence, the mean of its pieces,
        from one pass, read after the prompt where the Embedder has one (as `encode` reads the sentence). Raises
        ValueError for a span that falls (even partly) past the truncation."""
        text = self.prompted([sentence])[0]
        shift = len(text) - len(sentence)  # the prompt's characters before the sentence
        encoded = self.tokenize([text], offsets=True)
        pieces = spans_pieces(text, encoded["offset_mapping"][0].tolist(), [(a + shift, b + shift) for a, b in spans],
                              self.max_length, self.model.config.max_position_embeddings)
        states = self.layer_states(self.forward(encoded))[0]  # (seq, dim)
        return torch.stack([states[found].mean(dim=0) for found in pieces]).cpu().numpy()

    # --- the model ---------------------------------------------------------------------------

    def tokenize(self, texts: list[str], offsets: bool = False):
        return self.tokenizer(texts, truncation=True, max_length=self.max_length, padding=True,
                              return_tensors="pt", return_offsets_mapping=offsets)

    def forward(self, batch) -> EncoderOutput:
        """Run the encoder on a padded batch without autograd, dropout off."""
        with torch.inference_mode(), eval_mode(self.model):
            return self.model(
                batch["input_ids"].to(self.device),
                attention_mask=batch["attention_mask"].to(self.device),
                token_type_ids=batch["token_type_ids"].to(self.device),
                output_hidden_states=self.wants_hidden_states,
            )

    def layer_states(self, output: EncoderOutput) -> Tensor:
        """The chosen layers' token states, combined: float32 (batch, seq, dim)."""
        if output.hidden_states is None:
            return output.last_hidden_state.float()
        states = [output.hidden_states[i].float() for i in self.layers]
        if len(states) == 1:
            return states[0]
        if self.layer_combine == "concat":
            return torch.cat(states, dim=-1)
        return torch.stack(states).mean(dim=0)


def graphed_passes(embedder: Embedder, capture: bool = True) -> GraphedPasses:
    """The embedder's sentence-vector passes, replayed from CUDA graphs (capture False: the buckets' padding
    alone, for the CPU's tests). The graphs reach the embedder through a weak reference: a cycle between the
    two would hold the graphs' GPU memory until a full garbage collection, and adapt and the retrieval recipes
    make an Embedder for every evaluation."""
    owner = weakref.ref(embedder)
    return GraphedPasses(lambda *inputs: owner().padded_vectors(*inputs), embedder.device,
                         embedder.tokenizer.pad_token_id, capture=capture,
                         weights=lambda: owner().weight_addresses())
