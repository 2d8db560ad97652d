"""Sentence, word and token vectors, checked against sentence-transformers and transformers.

The oracle for every pooling and layer choice is written here from transformers'
`BertModel(output_hidden_states=True)` and its own tokenizer, one text at a time
(no padding at all), so it shares no code with bertforge.embed.
"""
import csv

import numpy as np
import pytest
import torch
import transformers

from bertforge import BertModel
from bertforge.embeddings import embed as embed_module
from bertforge.embeddings.embed import Embedder
from bertforge.embeddings.one_call import embed, token_vectors, word_vector
from bertforge.engine import batching
from bertforge.engine.batching import FIRST_TOKENIZE_WINDOW, TOKENIZE_WINDOW, tokenize_windows
from bertforge.models.heads import BertForSequenceClassification
from bertforge.tokenization.tokenizer import BertTokenizer

# The three senses of "bank": two financial, one river.
DEPOSIT, RIVER, LOAN = "I deposited money at the bank.", "We sat on the river bank.", "The bank approved my loan."


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def real_texts(data_dir):
    """500 real texts of mixed length: Emma's short lines, Persuasion's paragraphs (some past 256 tokens), tweets."""
    austen = data_dir / "austen"
    lines = [line.strip() for line in (austen / "emma.txt").read_text(encoding="utf-8").splitlines() if line.strip()]
    paragraphs = [" ".join(block.split()) for block in
                  (austen / "persuasion.txt").read_text(encoding="utf-8").split("\n\n") if block.strip()]
    with open(data_dir / "tweets-sentiment" / "tweets.csv", encoding="utf-8", newline="") as f:
        tweets = [row["text"] for row in csv.DictReader(f)]
    return lines[::60][:200] + paragraphs[::20][:50] + tweets[::150][:250]


@pytest.fixture(scope="module")
def mixed_texts(real_texts):
    """50 texts: every tenth real one (long and short side by side), an empty one and a two-token one."""
    return real_texts[::10][:48] + ["", "Hi."]  # an empty text is still [CLS] [SEP]


@pytest.fixture(scope="module")
def ours(minilm_dir):
    return BertModel.from_pretrained(minilm_dir), BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def reference(minilm_dir):
    return transformers.BertModel.from_pretrained(minilm_dir).eval(), transformers.BertTokenizer.from_pretrained(minilm_dir)


def reference_hidden_states(reference, text, max_length=512):
    """transformers' hidden states for one text, unpadded: (layers + 1, seq, hidden), and pooler_output."""
    model, tokenizer = reference
    encoded = tokenizer([text], truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        output = model(**encoded, output_hidden_states=True)
    return torch.stack(output.hidden_states)[:, 0], output.pooler_output[0]


@pytest.fixture(scope="module")
def reference_states(reference, mixed_texts):
    """reference_hidden_states of every mixed text, computed once for all the choices below."""
    return [reference_hidden_states(reference, text) for text in mixed_texts]


def reference_vector(states, pooled, pooling, layers, combine):
    if pooling == "pooler":
        return pooled
    per_layer = [{"cls": states[i, 0], "mean": states[i].mean(0), "max": states[i].max(0).values}[pooling]
                 for i in layers]
    return torch.cat(per_layer) if combine == "concat" else torch.stack(per_layer).mean(0)


def cosine(a, b):
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


# ---------------------------------------------------------------- sentence vectors

def test_normalised_mean_vectors_match_sentence_transformers(real_texts, minilm_dir):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(minilm_dir), device="cpu")
    # The folder's sentence_bert_config.json sets max_seq_length=256 and SentenceTransformer
    # truncates there; from_pretrained reads the same file, so both cut long paragraphs alike.
    embedder = Embedder.from_pretrained(minilm_dir, normalize=True)
    assert embedder.max_length == reference.max_seq_length == 256
    lengths = embedder.tokenize(real_texts)["attention_mask"].sum(1).tolist()
    # 160 of the 500 (each side encodes them in ~2 s on 2 AVX2 cores, not ~9): the first 150 and ten truncated ones
    texts = real_texts[:150] + [text for text, length in zip(real_texts[150:], lengths[150:]) if length == 256][:10]
    chosen = lengths[:150] + [256] * (len(texts) - 150)
    assert chosen.count(256) >= 2 and min(chosen) < 10  # truncation and short texts both exercised

    expected = reference.encode(texts, normalize_embeddings=True, batch_size=32)
    actual = embedder.encode(texts)
    assert actual.dtype == np.float32 and actual.shape == (len(texts), 384)
    assert np.abs(actual - expected).max() < 1e-5


CHOICES = [  # pooling, layers, layer_combine -> the hidden states they read (0 = embeddings .. 6), and how combined
    ("cls", -1, None, [6], "mean"), ("mean", -1, None, [6], "mean"), ("max", -1, None, [6], "mean"),
    ("pooler", -1, None, [6], "mean"), ("mean", -2, None, [5], "mean"), ("mean", "second_to_last", None, [5], "mean"),
    ("cls", 0, None, [0], "mean"), ("mean", "last_four_mean", None, [3, 4, 5, 6], "mean"),
    ("mean", [-4, -3, -2, -1], "mean", [3, 4, 5, 6], "mean"), ("mean", "last_four_concat", None, [3, 4, 5, 6], "concat"),
    ("max", [-4, -3, -2, -1], "concat", [3, 4, 5, 6], "concat"), ("cls", [1, 6], "concat", [1, 6], "concat"),
]


@pytest.mark.parametrize("pooling, layers, layer_combine, read, combine", CHOICES,
                         ids=[f"{c[0]}-{c[1]}" + (f"-{c[2]}" if c[2] else "") for c in CHOICES])
def test_each_pooling_and_layer_choice_matches_a_direct_computation(ours, reference_states, mixed_texts, pooling,
                                                                   layers, layer_combine, read, combine):
    model, tokenizer = ours
    actual = embed(model, mixed_texts, tokenizer=tokenizer, pooling=pooling, layers=layers,
                   layer_combine=layer_combine, batch_size=16)
    expected = torch.stack([reference_vector(states, pooled, pooling, read, combine)
                            for states, pooled in reference_states])
    assert actual.shape == (len(mixed_texts), 384 * (len(read) if combine == "concat" else 1))
    torch.testing.assert_close(torch.from_numpy(actual), expected, rtol=1e-4, atol=2e-5)


def test_order_is_restored_and_batch_size_does_not_change_vectors(ours, mixed_texts):
    model, tokenizer = ours
    one_at_a_time = embed(model, mixed_texts, tokenizer=tokenizer, batch_size=1)  # no padding anywhere
    for batch_size in (7, 64):
        batched = embed(model, mixed_texts, tokenizer=tokenizer, batch_size=batch_size)
        assert np.abs(batched - one_at_a_time).max() < 1e-5
    reversed_order = embed(model, mixed_texts[::-1], tokenizer=tokenizer, batch_size=7)
    assert np.abs(reversed_order[::-1] - one_at_a_time).max() < 1e-5


def test_tokenize_windows_start_small_then_cover_the_rest():
    assert tokenize_windows(0) == []
    assert tokenize_windows(100) == [(0, 100)]
    assert tokenize_windows(FIRST_TOKENIZE_WINDOW) == [(0, FIRST_TOKENIZE_WINDOW)]
    assert tokenize_windows(5_000) == [(0, 256), (256, 256 + TOKENIZE_WINDOW), (256 + TOKENIZE_WINDOW, 5_000)]


def test_rows_land_in_place_across_tokenize_windows(ours, mixed_texts, monkeypatch):
    model, tokenizer = ours
    whole = embed(model, mixed_texts, tokenizer=tokenizer, batch_size=4)
    monkeypatch.setattr(batching, "FIRST_TOKENIZE_WINDOW", 3)  # each window sorted and batched on its own
    monkeypatch.setattr(batching, "TOKENIZE_WINDOW", 5)
    assert len(tokenize_windows(len(mixed_texts))) > 2
    assert np.abs(embed(model, mixed_texts, tokenizer=tokenizer, batch_size=4) - whole).max() < 1e-5


def test_a_checkpoint_path_a_model_and_a_head_give_the_same_vectors(ours, minilm_dir, mixed_texts):
    model, tokenizer = ours
    texts = mixed_texts[:6]
    from_model = embed(model, texts, tokenizer=tokenizer, max_length=256)
    from_path = embed(minilm_dir, texts, normalize=False)  # the folder's own Normalize is what the others lack
    head = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2)
    from_head = embed(head, texts, tokenizer=tokenizer, max_length=256)
    # A folder's model is the Embedder's own: on an AVX-512 CPU it runs oneDNN's packed linear layers
    # (engine/prepacked_linear.py), whose sums round differently in the last bits
    np.testing.assert_allclose(from_path, from_model, atol=1e-5)
    np.testing.assert_array_equal(from_head, from_model)


def test_train_mode_is_left_as_found_and_dropout_is_off(ours, mixed_texts):
    model, tokenizer = ours
    expected = embed(model, mixed_texts[:4], tokenizer=tokenizer)
    model.train()
    try:
        actual = embed(model, mixed_texts[:4], tokenizer=tokenizer)
        assert model.training
    finally:
        model.eval()
    np.testing.assert_array_equal(actual, expected)


def test_hidden_states_are_requested_only_when_another_layer_is_chosen(ours, monkeypatch):
    import bertforge.embeddings.embed as embed_module

    model, tokenizer = ours
    requested, forward = [], embed_module.packed_forward
    monkeypatch.setattr(embed_module, "packed_forward", lambda model, batch, output_hidden_states, **options:
                        requested.append(output_hidden_states) or forward(model, batch, output_hidden_states, **options))
    embed(model, ["one text"], tokenizer=tokenizer, layers=-1)
    embed(model, ["one text"], tokenizer=tokenizer, layers=6)  # the last layer by its absolute index
    embed(model, ["one text"], tokenizer=tokenizer, layers=-2)
    assert requested == [False, False, True]


@pytest.mark.parametrize("dtype", [torch.bfloat16, "bf16"])
def test_bfloat16_weights_stay_close_to_float32_and_leave_the_callers_model_alone(ours, mixed_texts, dtype):
    model, tokenizer = ours
    texts = mixed_texts[:16]  # bf16 is emulated (slow) on CPUs without AVX512-BF16/AMX
    full = embed(model, texts, tokenizer=tokenizer)
    embedder = Embedder(model, tokenizer, dtype=dtype)
    assert embedder.model.embeddings.word_embeddings.weight.dtype == torch.bfloat16  # weights, not autocast
    assert model.embeddings.word_embeddings.weight.dtype == torch.float32  # converted as a copy
    half = embedder.encode(texts)
    assert half.dtype == np.float32
    assert not np.array_equal(half, full)  # it really ran in bf16
    assert min(cosine(a, b) for a, b in zip(half, full)) > 0.99


def test_progress_bar_follows_the_option(ours, capsys):
    model, tokenizer = ours
    embed(model, ["a", "b"], tokenizer=tokenizer, progress=True)
    assert "2/2" in capsys.readouterr().err
    embed(model, ["a", "b"], tokenizer=tokenizer)  # two texts: too few for the automatic bar
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------- word and token vectors

@pytest.mark.parametrize("layers", [-1, "last_four_mean"])
def test_bank_in_two_financial_sentences_is_closer_than_river_bank(ours, layers):
    model, tokenizer = ours
    deposit, river, loan = (word_vector(model, tokenizer, s, "bank", layers=layers) for s in (DEPOSIT, RIVER, LOAN))
    financial = cosine(deposit, loan)
    assert financial > cosine(deposit, river) and financial > cosine(loan, river)


def test_bank_is_told_apart_only_by_context(ours):
    # Control for the test above: before any attention (layer 0), "bank" at the same position
    # is the same vector whatever the sentence; the separation above comes from context.
    model, tokenizer = ours
    deposit, river = (word_vector(model, tokenizer, s, "bank", layers=0) for s in (DEPOSIT, RIVER))
    np.testing.assert_allclose(deposit, river, rtol=0, atol=1e-6)


def test_a_multi_piece_word_is_the_mean_of_its_pieces(ours, reference):
    model, tokenizer = ours
    sentence = "The Unaffable clerk walked along the riverbank."
    _, hf_tokenizer = reference
    pieces = hf_tokenizer.convert_ids_to_tokens(hf_tokenizer(sentence)["input_ids"])
    assert pieces[2:5] == ["una", "##ffa", "##ble"] and pieces[8:11] == ["the", "river", "##bank"]
    states, _ = reference_hidden_states(reference, sentence)
    last_four = states[3:].mean(0)  # (seq, hidden)

    unaffable = word_vector(model, tokenizer, sentence, "unaffable", layers="last_four_mean")
    np.testing.assert_allclose(unaffable, last_four[2:5].mean(0).numpy(), rtol=1e-4, atol=1e-5)
    phrase = word_vector(model, tokenizer, sentence, "the riverbank", layers="last_four_mean")
    np.testing.assert_allclose(phrase, last_four[8:11].mean(0).numpy(), rtol=1e-4, atol=1e-5)


def test_occurrence_picks_which_match(ours, reference):
    model, tokenizer = ours
    sentence = "The bank by the bank."
    states, _ = reference_hidden_states(reference, sentence)
    second = word_vector(model, tokenizer, sentence, "bank", occurrence=1, layers=-1)
    np.testing.assert_allclose(second, states[-1, 5].numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(word_vector(model, tokenizer, sentence, "BANK", occurrence=-1, layers=-1), second)
    # Left out, the layers are a word vector's default: the mean of the last four.
    np.testing.assert_allclose(word_vector(model, tokenizer, sentence, "bank", occurrence=1),
                               states[-4:, 5].mean(0).numpy(), rtol=1e-4, atol=1e-5)


def test_token_vectors_are_the_hidden_states_of_every_token(ours, reference):
    model, tokenizer = ours
    sentence = "The riverbank was unaffable."
    tokens, vectors = token_vectors(model, tokenizer, sentence, layers=-2)
    assert tokens == ["[CLS]", "the", "river", "##bank", "was", "una", "##ffa", "##ble", ".", "[SEP]"]
    states, _ = reference_hidden_states(reference, sentence)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, states[5].numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("word, options, message", [
    ("money", {}, "'money' is not in the sentence"),
    ("ban", {}, "as a whole word"),  # a prefix of "bank" is not the word
    ("bank", {"occurrence": 1}, "occurs 1 time(s)"),
    ("", {}, "must be a non-empty str"),
    ("bank", {"max_length": 6}, "falls past the truncation at max_length=6"),
])
def test_word_vector_errors_say_what_went_wrong(ours, word, options, message):
    model, tokenizer = ours
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        word_vector(model, tokenizer, "We sat on the river bank.", word, **options)


# ---------------------------------------------------------------- validation

def test_an_empty_list_gives_an_empty_array_of_the_right_width(ours):
    model, tokenizer = ours
    assert embed(model, [], tokenizer=tokenizer).shape == (0, 384)
    assert embed(model, [], tokenizer=tokenizer, layers="last_four_concat").shape == (0, 4 * 384)


@pytest.mark.parametrize("texts, options, message", [
    (["a", "b", 3], {}, r"texts\[2\] is int, not str"),
    (["a", float("nan")], {}, r"texts\[1\] is float.*missing value"),
    ("one text", {}, "pass a list of texts"),
    (["a"], {"pooling": "sum"}, r"pooling='sum' is not one of \('cls', 'mean', 'max', 'pooler'\)"),
    (["a"], {"layers": "middle"}, "use one of .*'last_four_mean'"),
    (["a"], {"layers": 7}, "the model has 6 layers"),
    (["a"], {"layers": [-1, -8]}, "layer -8 is out of range: the model has 6 layers"),
    (["a"], {"layers": []}, "layers is empty"),
    (["a"], {"layers": [1.5]}, "not an int"),
    (["a"], {"layers": [-2, -1], "layer_combine": "sum"}, r"not one of \('mean', 'concat'\)"),
    (["a"], {"layers": "last_four_mean", "layer_combine": "concat"}, "already means layer_combine='mean'"),
    (["a"], {"pooling": "pooler", "layers": -2}, "use it with layers=-1"),
    (["a"], {"batch_size": 0}, "batch_size must be at least 1, got 0"),
    (["a"], {"batch_size": 2.0}, "batch_size must be an integer, got 2.0"),
    (["a"], {"max_length": 1000}, "max_length must be at most 512, got 1000 .* the model's max_position_embeddings"),
    (["a"], {"dtype": torch.float64}, "torch.bfloat16 or torch.qint8"),
    (["a"], {"dtype": "int4"}, "their names fp32, fp16, bf16, int8"),
    (["a"], {"max_batch_tokens": 1}, r"max_batch_tokens must be at least 2, got 1 \(\[CLS\] and \[SEP\]\)"),
])
def test_invalid_input_raises_a_value_error_that_says_what_to_do(ours, texts, options, message):
    model, tokenizer = ours
    with pytest.raises(ValueError, match=message):
        embed(model, texts, tokenizer=tokenizer, **options)


def test_a_model_object_needs_its_tokenizer_and_must_be_a_bert(ours, reference):
    model, tokenizer = ours
    with pytest.raises(ValueError, match="tokenizer is required"):
        embed(model, ["a"])
    with pytest.raises(ValueError, match="got transformers.*BertModel.*bertforge.BertModel.from_pretrained"):
        embed(reference[0], ["a"], tokenizer=tokenizer)  # transformers' BertModel, not ours


def test_pooler_needs_a_model_that_has_one(minilm_dir, ours):
    _, tokenizer = ours
    without_pooler = BertModel.from_pretrained(minilm_dir)
    without_pooler.pooler = None
    with pytest.raises(ValueError, match="has no pooler"):
        embed(without_pooler, ["a"], tokenizer=tokenizer, pooling="pooler")


def test_a_folder_loads_on_the_device_the_commands_choose(cassette_dir, monkeypatch):
    """The CLI and search.Index took the GPU when there was one; Embedder.from_pretrained and bertforge.embed kept a
    folder's model on the CPU, where it was loaded. int8 runs on the CPU only, and stays there."""
    import bertforge.embeddings.embed as embed_module

    asked = []
    monkeypatch.setattr(embed_module, "device_from_option", lambda value: asked.append(value) or torch.device("cpu"))
    Embedder.from_pretrained(cassette_dir)
    assert asked == [None]
    Embedder.from_pretrained(cassette_dir, dtype="int8")
    Embedder.from_pretrained(cassette_dir, device="cpu")
    assert asked == [None]


def test_token_and_word_vectors_read_the_folders_default_prompt_as_sentence_transformers(minilm_dir, tmp_path):
    """A folder whose default prompt is "query: ": sentence-transformers' token_embeddings and the server's /embed_all
    read the prompt's tokens before the sentence; Embedder.token_vectors and word_vector left it out (11 tokens
    against 13, and other vectors for the tokens they share)."""
    import json
    import shutil

    from sentence_transformers import SentenceTransformer

    from bertforge.embeddings.embed import Embedder

    folder = shutil.copytree(minilm_dir, tmp_path / "prompted")
    settings = json.loads((folder / "config_sentence_transformers.json").read_text())
    settings.update(prompts={"query": "query: "}, default_prompt_name="query")
    (folder / "config_sentence_transformers.json").write_text(json.dumps(settings))
    sentence = "The patient went to the river bank."
    expected = SentenceTransformer(str(folder), device="cpu").encode(sentence, output_value="token_embeddings")
    embedder = Embedder.from_pretrained(folder)
    tokens, vectors = embedder.token_vectors(sentence)
    assert tokens[:4] == ["[CLS]", "query", ":", "the"]
    np.testing.assert_allclose(vectors, expected.numpy(), atol=1e-5)
    bank = tokens.index("bank")
    np.testing.assert_allclose(embedder.word_vector(sentence, "bank"), expected[bank].numpy(), atol=1e-5)
