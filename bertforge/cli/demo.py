"""`bertforge demo`: the seeds' walk-through (McCormick & Ryan's BERT word embeddings
tutorial) on a real checkpoint, each step done by the library in one call.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..embeddings.one_call import embed, word_vector
from ..models.folder import read_model_folder
from ..models.model import BertModel
from ..models.summary import parameter_table
from ..tokenization.folder import load_tokenizer

SENTENCE = "After stealing money from the bank vault, the bank robber was seen fishing on the Mississippi river bank."
SIMILARITY_SENTENCES = [
    "The patient was discharged home in stable condition.",
    "She left the hospital feeling well.",
    "It is a truth universally acknowledged that a single man must be in want of a wife.",
    "Stocks fell sharply after the bank raised interest rates.",
]


def heading(text: str) -> None:
    print(f"\n=== {text} " + "=" * max(0, 70 - len(text)))


def walk_through(folder: str | Path) -> None:
    torch.manual_seed(0)
    model = BertModel.from_pretrained(folder)
    tokenizer = load_tokenizer(read_model_folder(folder))
    config = model.config
    heading(f"checkpoint {folder}")
    print(f"{config.num_hidden_layers} layers, hidden {config.hidden_size}, {config.num_attention_heads} heads, "
          f"vocab {config.vocab_size:,}, {model.num_parameters():,} parameters")
    print(parameter_table(model).split("\n\n")[1])  # the embedding block, as seed 002 prints it first

    heading("1. WordPiece tokens and their ids")
    encoding = tokenizer(SENTENCE, return_tensors="pt")
    tokens = tokenizer.convert_ids_to_tokens(encoding["input_ids"][0].tolist())
    print(f"text: {SENTENCE}")
    for position, (token, token_id) in enumerate(zip(tokens, encoding["input_ids"][0].tolist())):
        print(f"  {position:>3}  {token:<14} {token_id:>7}")

    heading("2. The embedding layer: token + segment + position, then LayerNorm")
    with torch.inference_mode():
        output = model(**encoding, output_hidden_states=True)
        layer = model.embeddings
        ids, segments = encoding["input_ids"], encoding["token_type_ids"]
        positions = torch.arange(ids.size(1))[None]
        parts = {"token": layer.word_embeddings(ids), "segment": layer.token_type_embeddings(segments),
                 "position": layer.position_embeddings(positions)}
        summed = sum(parts.values())
        normalised = layer.LayerNorm(summed)
    for name, part in parts.items():
        print(f"  {name:<9} embedding of {tokens[1]!r}: {fmt(part[0, 1, :4])} ...  shape {tuple(part.shape)}")
    print(f"  sum                         : {fmt(summed[0, 1, :4])} ...")
    print(f"  LayerNorm(sum)              : {fmt(normalised[0, 1, :4])} ...")
    difference = (normalised - output.hidden_states[0]).abs().max().item()
    print(f"  equals the model's hidden_states[0] (max |diff| {difference:.1e})")

    heading("3. Hidden states: the embedding output + one per encoder layer")
    hidden_states = output.hidden_states
    print(f"  {len(hidden_states)} hidden states (embeddings + {config.num_hidden_layers} layers), "
          f"each (batch, tokens, hidden) = {tuple(hidden_states[0].shape)}")
    stacked = torch.stack(hidden_states, dim=0).squeeze(1).permute(1, 0, 2)
    print(f"  stacked per token (tokens, layers, hidden) = {tuple(stacked.shape)}")

    heading("4. 'bank' in context: one word, three vectors")
    senses = {"bank vault": 0, "bank robber": 1, "river bank": 2}
    vectors = {name: word_vector(model, tokenizer, SENTENCE, "bank", occurrence=k) for name, k in senses.items()}
    names = list(vectors)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            print(f"  cosine({a!r}, {b!r}) = {cosine(vectors[a], vectors[b]):.3f}")

    heading("5. Sentence similarity (mean pooling, L2-normalised)")
    sentence_vectors = embed(model, SIMILARITY_SENTENCES, tokenizer=tokenizer, pooling="mean", normalize=True)
    similarity = sentence_vectors @ sentence_vectors.T
    for i, sentence in enumerate(SIMILARITY_SENTENCES):
        print(f"  [{i}] {sentence}")
    print("      " + "".join(f"[{j}]    " for j in range(len(SIMILARITY_SENTENCES))))
    for i, row in enumerate(similarity):
        print(f"  [{i}] " + " ".join(f"{value:6.3f}" for value in row))


def fmt(values: torch.Tensor) -> str:
    return "[" + ", ".join(f"{v:+.4f}" for v in values.tolist()) + "]"


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
