"""Parity with `transformers` on random weights: every head's logits, loss and gradients.

The tiny config is the one google-research/bert's modeling_test.py and transformers'
test_modeling_bert.py use: odd sizes (hidden 32, intermediate 37, seq 7, batch 13) catch
shape bugs that round numbers hide.
"""
import pytest
import torch
import transformers

import bertforge
from bertforge import BertConfig
from bertforge.engine.unpadding import Packing

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=512, type_vocab_size=16, initializer_range=0.02)
BATCH, SEQ = 13, 7


def tiny_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, TINY["vocab_size"], (BATCH, SEQ), generator=g)
    attention_mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    lengths = torch.randint(2, SEQ + 1, (BATCH,), generator=g)
    for row, length in enumerate(lengths):
        attention_mask[row, length:] = 0  # real padding, so the mask path is exercised
    token_type_ids = torch.randint(0, 2, (BATCH, SEQ), generator=g)
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids), g


def labels_for(name, g, num_labels):
    if name in ("BertForPreTraining", "BertForMaskedLM"):
        labels = torch.randint(0, TINY["vocab_size"], (BATCH, SEQ), generator=g)
        labels[torch.rand(BATCH, SEQ, generator=g) > 0.3] = -100
        extra = dict(labels=labels)
        if name == "BertForPreTraining":
            extra["next_sentence_label"] = torch.randint(0, 2, (BATCH,), generator=g)
        return extra
    if name == "BertForNextSentencePrediction":
        return dict(labels=torch.randint(0, 2, (BATCH,), generator=g))
    if name == "BertForTokenClassification":
        labels = torch.randint(0, num_labels, (BATCH, SEQ), generator=g)
        labels[:, 0] = -100
        return dict(labels=labels)
    if name == "BertForQuestionAnswering":
        return dict(start_positions=torch.randint(0, SEQ, (BATCH,), generator=g),
                    end_positions=torch.randint(0, SEQ + 3, (BATCH,), generator=g))  # some out of window
    return dict(labels=torch.randint(0, num_labels, (BATCH,), generator=g))


def gradients(model) -> dict:
    """Parameter gradients by name (the names are transformers' own)."""
    return {k: p.grad for k, p in model.named_parameters() if p.grad is not None}


def pair(name, tmp_path, **config_extra):
    """The same random weights in a transformers model and in ours (through a HF-format save)."""
    torch.manual_seed(0)
    hf_config = transformers.BertConfig(**TINY, **config_extra, attn_implementation="eager")
    reference = getattr(transformers, name)(hf_config).eval()
    reference.save_pretrained(tmp_path)
    ours = getattr(bertforge, name).from_pretrained(tmp_path).eval()
    return reference, ours


OUTPUT_FIELDS = {
    "BertModel": ["last_hidden_state", "pooler_output"],
    "BertForPreTraining": ["loss", "prediction_logits", "seq_relationship_logits"],
    "BertForQuestionAnswering": ["loss", "start_logits", "end_logits"],
}
HEADS = ["BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForNextSentencePrediction",
         "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering"]


@pytest.mark.parametrize("name", HEADS)
def test_outputs_loss_and_gradients_match_transformers(name, tmp_path):
    # transformers sizes the QA layer by num_labels, which only works at its default of 2.
    reference, ours = pair(name, tmp_path, num_labels=2 if name == "BertForQuestionAnswering" else 3)
    inputs, g = tiny_inputs()
    if name != "BertModel":
        inputs.update(labels_for(name, g, num_labels=3))
    ref_out = reference(**inputs, output_hidden_states=True, output_attentions=True)
    our_out = ours(**inputs, output_hidden_states=True, output_attentions=True)

    valid = inputs["attention_mask"].bool()
    for field in OUTPUT_FIELDS.get(name, ["loss", "logits"]):
        expected, actual = getattr(ref_out, field), getattr(our_out, field)
        if expected.dim() >= 2 and expected.shape[:2] == (BATCH, SEQ):
            expected, actual = expected[valid], actual[valid]  # padded positions carry no meaning
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4, msg=f"{name}.{field}")
    for ref_h, our_h in zip(ref_out.hidden_states, our_out.hidden_states, strict=True):
        torch.testing.assert_close(our_h[valid], ref_h[valid], atol=1e-5, rtol=1e-4)
    for ref_a, our_a in zip(ref_out.attentions, our_out.attentions, strict=True):
        torch.testing.assert_close(our_a, ref_a, atol=1e-5, rtol=1e-4)

    # BertModel has no loss: project onto fixed random directions (a sum of squares after
    # LayerNorm would be a constant with zero gradient).
    directions = torch.randn(TINY["hidden_size"], generator=g)
    scalar = lambda out: out.loss if name != "BertModel" else (out.last_hidden_state[valid] @ directions).sum()
    scalar(ref_out).backward()
    scalar(our_out).backward()
    ref_grads = {k: p.grad for k, p in reference.named_parameters() if p.grad is not None}
    our_grads = gradients(ours)
    assert set(our_grads) == set(ref_grads)
    for key, grad in ref_grads.items():
        torch.testing.assert_close(our_grads[key], grad, atol=1e-5, rtol=1e-4, msg=key)


@pytest.mark.parametrize("problem_type,num_labels", [("regression", 1), ("multi_label_classification", 4)])
def test_sequence_classification_problem_types_match(problem_type, num_labels, tmp_path):
    reference, ours = pair("BertForSequenceClassification", tmp_path, num_labels=num_labels, problem_type=problem_type)
    inputs, g = tiny_inputs(seed=1)
    if problem_type == "regression":
        labels = torch.randn(BATCH, generator=g)
    else:
        labels = (torch.rand(BATCH, num_labels, generator=g) > 0.5).float()
    torch.testing.assert_close(ours(**inputs, labels=labels).loss, reference(**inputs, labels=labels).loss)


def test_gelu_new_activation_matches(tmp_path):
    reference, ours = pair("BertModel", tmp_path, hidden_act="gelu_new")
    inputs, _ = tiny_inputs(seed=2)
    torch.testing.assert_close(ours(**inputs).pooler_output, reference(**inputs).pooler_output, atol=1e-5, rtol=1e-4)


def test_sdpa_path_equals_explicit_attention():
    """The fused kernel (no probabilities asked) and the spelled-out softmax give one answer."""
    model = bertforge.BertModel(BertConfig(**TINY)).eval()
    inputs, _ = tiny_inputs(seed=3)
    fused = model(**inputs).last_hidden_state
    explicit = model(**inputs, output_attentions=True).last_hidden_state
    torch.testing.assert_close(fused, explicit, atol=1e-6, rtol=1e-5)


def test_initialisation_follows_bert():
    config = BertConfig(**TINY)
    model = bertforge.BertForPreTraining(config)
    words = model.bert.embeddings.word_embeddings.weight
    assert torch.all(words[config.pad_token_id] == 0)
    assert abs(words[1:].std().item() - config.initializer_range) < 0.002
    layer = model.bert.encoder.layer[0]
    assert all(torch.all(getattr(layer.attention.self, name).bias == 0) for name in ("query", "key", "value"))
    assert torch.all(layer.output.LayerNorm.weight == 1) and torch.all(layer.output.LayerNorm.bias == 0)
    assert torch.all(model.cls.predictions.bias == 0)
    assert model.cls.predictions.decoder.weight is words  # MLM decoder tied to the word embeddings


def test_presets_follow_the_bert_family():
    for name, (layers, hidden) in {"tiny": (2, 128), "mini": (4, 256), "small": (4, 512),
                                   "medium": (8, 512), "base": (12, 768), "large": (24, 1024)}.items():
        config = BertConfig.from_preset(name)
        assert (config.num_hidden_layers, config.hidden_size) == (layers, hidden)
        assert config.intermediate_size == 4 * hidden and config.hidden_size // config.num_attention_heads == 64
    base = bertforge.BertModel(BertConfig.from_preset("base"))
    assert base.num_parameters() == 109_482_240  # BERT-base's published 110M, exactly as transformers counts
    with pytest.raises(ValueError, match="choose one of"):
        BertConfig.from_preset("huge")


def test_config_round_trips_through_hf_json(tmp_path):
    config = BertConfig.from_preset("mini", id2label={0: "neg", 1: "pos"})
    config.to_json_file(tmp_path / "config.json")
    hf = transformers.BertConfig.from_pretrained(tmp_path)
    assert (hf.hidden_size, hf.num_hidden_layers, hf.id2label, hf.label2id) == (256, 4, {0: "neg", 1: "pos"}, {"neg": 0, "pos": 1})
    hf.save_pretrained(tmp_path / "back")
    again = BertConfig.from_json_file(tmp_path / "back" / "config.json")
    assert again.id2label == config.id2label and again.hidden_size == 256


def test_bad_config_is_explained():
    with pytest.raises(ValueError, match="multiple of num_attention_heads"):
        BertConfig(hidden_size=100, num_attention_heads=12)
    with pytest.raises(ValueError, match="not supported"):
        BertConfig(hidden_act="swish")
    model = bertforge.BertModel(BertConfig(**{**TINY, "max_position_embeddings": 8}))
    with pytest.raises(ValueError, match="truncate"):
        model(torch.ones(1, 9, dtype=torch.long))


@pytest.mark.parametrize("name", ["BertForPreTraining", "BertForMaskedLM"])
def test_masked_only_head_gives_the_full_heads_loss_and_gradients(name):
    """The fast path scores only labelled positions: same loss, same gradients, fewer rows."""
    torch.manual_seed(0)
    model = getattr(bertforge, name)(BertConfig(**TINY)).eval()
    inputs, g = tiny_inputs(seed=4)
    inputs.update(labels_for(name, g, num_labels=2))
    full = model(**inputs)
    full.loss.backward()
    full_grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    fast = model(**inputs, masked_only=True)
    fast.loss.backward()
    torch.testing.assert_close(fast.loss, full.loss)
    logits = fast.prediction_logits if name == "BertForPreTraining" else fast.logits
    selected = inputs["labels"] != -100
    full_logits = full.prediction_logits if name == "BertForPreTraining" else full.logits
    assert logits.shape == (int(selected.sum()), TINY["vocab_size"])
    torch.testing.assert_close(logits, full_logits[selected])
    for key, grad in full_grads.items():
        torch.testing.assert_close(dict(model.named_parameters())[key].grad, grad, atol=1e-6, rtol=1e-5, msg=key)


def test_pretraining_without_nsp_labels_is_mlm_only():
    model = bertforge.BertForPreTraining(BertConfig(**TINY)).eval()
    inputs, g = tiny_inputs(seed=5)
    extra = labels_for("BertForPreTraining", g, num_labels=2)
    mlm_only = model(**inputs, labels=extra["labels"]).loss
    both = model(**inputs, **extra).loss
    nsp = torch.nn.functional.cross_entropy(model(**inputs).seq_relationship_logits, extra["next_sentence_label"])
    torch.testing.assert_close(both, mlm_only + nsp)


NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.mark.parametrize("masked_only", [False, True])
def test_unpadded_training_path_matches_transformers(masked_only, tmp_path):
    """Packed, the encoder drops padding once and restores it once: same loss, logits, states, gradients."""
    reference, ours = pair("BertForPreTraining", tmp_path, **NO_DROPOUT)
    reference.train(), ours.train()
    inputs, g = tiny_inputs(seed=6)
    inputs.update(labels_for("BertForPreTraining", g, num_labels=2))
    valid = inputs["attention_mask"].bool()
    inputs["labels"][~valid] = -100  # as in real pretraining data: padding is never a prediction target
    ref_out = reference(**inputs, output_hidden_states=True)
    our_out = ours(**inputs, output_hidden_states=True, masked_only=masked_only,
                   packing=Packing.from_attention_mask(inputs["attention_mask"]))

    torch.testing.assert_close(our_out.loss, ref_out.loss, atol=1e-5, rtol=1e-4)
    selected = inputs["labels"] != -100
    expected_logits = ref_out.prediction_logits[selected] if masked_only else ref_out.prediction_logits[valid]
    actual_logits = our_out.prediction_logits if masked_only else our_out.prediction_logits[valid]
    torch.testing.assert_close(actual_logits, expected_logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(our_out.seq_relationship_logits, ref_out.seq_relationship_logits, atol=1e-5, rtol=1e-4)
    for ref_h, our_h in zip(ref_out.hidden_states, our_out.hidden_states, strict=True):
        assert our_h.shape == ref_h.shape
        torch.testing.assert_close(our_h[valid], ref_h[valid], atol=1e-5, rtol=1e-4)
    ref_out.loss.backward()
    our_out.loss.backward()
    ref_grads = {k: p.grad for k, p in reference.named_parameters() if p.grad is not None}
    our_grads = gradients(ours)
    assert set(our_grads) == set(ref_grads)
    for key, grad in ref_grads.items():
        torch.testing.assert_close(our_grads[key], grad, atol=1e-5, rtol=1e-4, msg=key)


def test_unpadded_path_equals_padded_path_with_dropout_off():
    """Packing changes nothing but speed; asking for attentions falls back to the padded path."""
    torch.manual_seed(0)
    model = bertforge.BertModel(BertConfig(**TINY, **NO_DROPOUT)).train()
    inputs, g = tiny_inputs(seed=7)
    valid = inputs["attention_mask"].bool()
    directions = torch.randn(TINY["hidden_size"], generator=g)
    results = {}
    for packing in (None, Packing.from_attention_mask(inputs["attention_mask"])):
        model.zero_grad()
        out = model(**inputs, output_hidden_states=True, packing=packing)
        (out.last_hidden_state[valid] @ directions).sum().backward()
        results[packing is not None] = out, gradients(model)
    (padded, padded_grads), (unpadded, unpadded_grads) = results[False], results[True]
    for ours, reference in zip(unpadded.hidden_states, padded.hidden_states, strict=True):
        torch.testing.assert_close(ours[valid], reference[valid], atol=1e-6, rtol=1e-5)
    assert torch.all(unpadded.last_hidden_state[~valid] == 0)  # padding comes back as zeros
    torch.testing.assert_close(unpadded.pooler_output, padded.pooler_output, atol=1e-6, rtol=1e-5)
    assert set(unpadded_grads) == set(padded_grads)
    for key, grad in padded_grads.items():
        torch.testing.assert_close(unpadded_grads[key], grad, atol=1e-6, rtol=1e-5, msg=key)
    with_attentions = model(**inputs, output_attentions=True,
                            packing=Packing.from_attention_mask(inputs["attention_mask"]))
    assert with_attentions.attentions[0].shape == (BATCH, TINY["num_attention_heads"], SEQ, SEQ)
    torch.testing.assert_close(with_attentions.last_hidden_state[valid], padded.last_hidden_state[valid],
                               atol=1e-6, rtol=1e-5)


def test_vocabulary_slices_give_the_whole_projection():
    """The masked-only head projects onto the vocabulary in slices on CPU: same scores, same gradients."""
    torch.manual_seed(0)
    model = bertforge.BertForMaskedLM(BertConfig(**TINY))
    head = model.cls.predictions
    hidden_states = torch.randn(11, TINY["hidden_size"])
    results = []
    for vocab_slice in (None, 16):  # 99 words: six slices of 16 and a last one of 3
        model.zero_grad()
        logits = head(hidden_states, vocab_slice)
        (logits * torch.linspace(-1, 1, TINY["vocab_size"])).sum().backward()
        results.append((logits, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}))
    (whole, whole_grads), (sliced, sliced_grads) = results
    torch.testing.assert_close(sliced, whole)
    assert set(sliced_grads) == set(whole_grads) and sliced_grads
    for key, grad in whole_grads.items():
        torch.testing.assert_close(sliced_grads[key], grad, msg=key)
