"""The shared engine on CPU: packing bookkeeping, every packed attention kernel against attention
computed one sequence at a time, the packed model against the padded one, fullgraph compile.

tests/test_gpu.py runs the CUDA side (the same "repadded" kernel on the GPU, in bf16 and fp32).
"""
import math

import pytest
import torch

import bertforge
from bertforge import BertConfig
from bertforge.engine import attention as attention_module
from bertforge.engine.attention import attention
from bertforge.engine.unpadding import Packing, equal_length_runs, packing_if_it_pays, pad, unpad
from bertforge.models.heads import masked_positions_from

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
KERNELS = ["repadded", "length_grouped"]


def mask_of(lengths, seq):
    return (torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]).long()


def per_sequence_attention(query, key, value, cu_seqlens):
    """Attention one sequence at a time: packed (tokens, heads, d) in, (tokens, heads, d) out."""
    bounds = cu_seqlens.tolist()
    assert bounds[0] == 0 and bounds[-1] == query.size(0)
    contexts = []
    for start, end in zip(bounds, bounds[1:]):
        q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))  # (heads, length, d)
        probs = (q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))).softmax(-1)
        contexts.append((probs @ v).transpose(0, 1))
    return torch.cat(contexts)


@pytest.fixture
def use_kernel(monkeypatch):
    """Force the packed kernel."""
    def use(name):
        monkeypatch.setattr(attention_module, "packed_kernel", lambda query, dropout_p=0.0: name)
    return use


def test_packing_records_where_the_real_tokens_are():
    mask = mask_of([3, 5, 1], seq=5)
    packing = Packing.from_attention_mask(mask)
    assert packing.token_indices.tolist() == [0, 1, 2, 5, 6, 7, 8, 9, 10]
    assert packing.cu_seqlens.dtype == torch.int32 and packing.cu_seqlens.tolist() == [0, 3, 8, 9]
    assert (packing.batch_size, packing.seq_len, packing.num_tokens) == (3, 5, 9)
    assert torch.equal(packing.key_mask, mask.bool()[:, None, None, :])
    states = torch.randn(3, 5, 4)
    assert unpad(states, packing).shape == (9, 4)
    torch.testing.assert_close(pad(unpad(states, packing), packing), states * mask[..., None])


def test_packing_is_made_only_where_it_pays():
    assert packing_if_it_pays(mask_of([10, 10, 10, 10], seq=10), "cpu") is None  # nothing padded
    assert packing_if_it_pays(mask_of([10, 10, 10, 8], seq=10), "cpu") is None  # 5%: not worth it on CPU
    assert packing_if_it_pays(mask_of([10, 10, 10, 8], seq=10), "cuda") is not None
    packing = packing_if_it_pays(mask_of([10, 5, 5, 5], seq=10), "cpu")  # 37.5%
    assert packing.cu_seqlens.tolist() == [0, 10, 15, 20, 25]


def test_equal_lengths_are_grouped_keeping_a_sorted_batchs_order():
    assert equal_length_runs([9, 9, 5, 3, 3, 3]) == (((2, 9), (1, 5), (3, 3)), None)  # already adjacent: no reorder
    assert equal_length_runs([3, 9, 3, 0, 9]) == (((2, 9), (2, 3)), [1, 4, 0, 2, 3])  # longest first, stable
    assert equal_length_runs([4, 0, 4]) == (((2, 4),), None)  # an empty row has no tokens to group


def test_length_groups_put_each_groups_tokens_side_by_side():
    packing = Packing.from_attention_mask(mask_of([2, 3, 2], seq=3))  # packed rows: a a b b b c c
    groups = packing.length_groups
    assert groups.runs == ((1, 3), (2, 2)) and groups.order.tolist() == [2, 3, 4, 0, 1, 5, 6]
    assert groups.restore.tolist() == [3, 4, 0, 1, 2, 5, 6]  # grouped rows back in the packed order
    assert Packing.from_attention_mask(mask_of([3, 2, 2], seq=3)).length_groups.order is None


def test_the_cpu_groups_by_length_for_inference_only():
    """Training (and torch.compile, which would re-trace for every batch's groups) keeps one padded call."""
    query = torch.zeros(4, 2, 8)
    with torch.inference_mode():
        assert attention_module.packed_kernel(query) == "length_grouped"
    assert attention_module.packed_kernel(query) == "repadded"
    with torch.no_grad():  # the gradient cache's first pass, attention dropout on: the masks training redraws
        assert attention_module.packed_kernel(query, dropout_p=0.1) == "repadded"


@pytest.mark.parametrize("kernel, short_limit", [("repadded", 0), ("length_grouped", 0), ("length_grouped", 5),
                                                 ("length_grouped", 100)])
def test_packed_kernels_equal_attention_one_sequence_at_a_time(kernel, short_limit, use_kernel, monkeypatch):
    """length_grouped with every group fused (0), short groups as matmuls and long ones fused (5), all matmuls."""
    use_kernel(kernel)
    monkeypatch.setattr(attention_module, "SHORT_ATTENTION_MAX_LENGTH", short_limit)
    g = torch.Generator().manual_seed(0)
    packing = Packing.from_attention_mask(mask_of([7, 2, 5, 1, 6], seq=7))
    query, key, value = (torch.randn(packing.num_tokens, 3, 8, generator=g, requires_grad=True) for _ in range(3))
    context, probs = attention(query, key, value, packing=packing)
    assert probs is None and context.shape == query.shape
    weights = torch.randn(context.shape, generator=g)
    (context * weights).sum().backward()
    grads = [t.grad.clone() for t in (query, key, value)]
    for t in (query, key, value):
        t.grad = None
    expected = per_sequence_attention(query, key, value, packing.cu_seqlens)
    (expected * weights).sum().backward()
    torch.testing.assert_close(context, expected, atol=1e-6, rtol=1e-5)
    for grad, t in zip(grads, (query, key, value)):
        torch.testing.assert_close(grad, t.grad, atol=1e-6, rtol=1e-5)


def test_padded_attention_matches_the_packed_one_and_gives_probabilities():
    g = torch.Generator().manual_seed(1)
    mask = mask_of([4, 2, 3], seq=4)
    packing = Packing.from_attention_mask(mask)
    query, key, value = (torch.randn(3, 4, 2, 8, generator=g) for _ in range(3))  # (batch, seq, heads, d)
    fused, _ = attention(query, key, value, key_mask=packing.key_mask)
    explicit, probs = attention(query, key, value, key_mask=packing.key_mask, return_probs=True)
    packed, _ = attention(*(unpad(t, packing) for t in (query, key, value)), packing=packing)
    valid = mask.bool()
    torch.testing.assert_close(fused, explicit, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(fused[valid], packed, atol=1e-6, rtol=1e-5)
    assert probs.shape == (3, 2, 4, 4) and torch.all(probs[1, :, :, 2:] == 0)  # no weight on padding
    with pytest.raises(ValueError, match="padded layout"):
        attention(*(unpad(t, packing) for t in (query, key, value)), packing=packing, return_probs=True)


def pretraining_batch(seed=0, batch=6, seq=9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, seq + 1, (batch,), generator=g).tolist()
    lengths[0] = seq
    mask = mask_of(lengths, seq)
    labels = torch.randint(0, TINY["vocab_size"], (batch, seq), generator=g)
    labels[(torch.rand(batch, seq, generator=g) > 0.3) | ~mask.bool()] = -100
    return dict(input_ids=torch.randint(1, TINY["vocab_size"], (batch, seq), generator=g), attention_mask=mask,
                token_type_ids=torch.randint(0, 2, (batch, seq), generator=g), labels=labels,
                next_sentence_label=torch.randint(0, 2, (batch,), generator=g))


@pytest.mark.parametrize("kernel", KERNELS)
def test_unpadded_model_equals_padded_in_states_logits_loss_and_gradients(kernel, use_kernel):
    """fp32, dropout off: the packed path may differ from the padded one by rounding only (<= 1e-5)."""
    use_kernel(kernel)
    torch.manual_seed(0)
    model = bertforge.BertForPreTraining(BertConfig(**TINY)).train()
    batch = pretraining_batch()
    valid = batch["attention_mask"].bool()
    runs = {}
    for packed in (False, True):
        extra = dict(packing=Packing.from_attention_mask(batch["attention_mask"]),
                     masked_positions=masked_positions_from(batch["labels"])) if packed else {}
        model.zero_grad()
        out = model(**batch, masked_only=True, output_hidden_states=True, **extra)
        out.loss.backward()
        runs[packed] = out, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    (padded, padded_grads), (unpadded, unpadded_grads) = runs[False], runs[True]
    torch.testing.assert_close(unpadded.loss, padded.loss, atol=1e-5, rtol=0)
    torch.testing.assert_close(unpadded.prediction_logits, padded.prediction_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(unpadded.seq_relationship_logits, padded.seq_relationship_logits, atol=1e-5, rtol=0)
    for ours, reference in zip(unpadded.hidden_states, padded.hidden_states, strict=True):
        torch.testing.assert_close(ours[valid], reference[valid], atol=1e-5, rtol=0)
    assert set(unpadded_grads) == set(padded_grads) and "bert.encoder.layer.0.attention.self.key.weight" in padded_grads
    for key, grad in padded_grads.items():
        torch.testing.assert_close(unpadded_grads[key], grad, atol=1e-5, rtol=0, msg=key)


@pytest.mark.slow  # inductor's compile, as compiled training's tests: make test-slow
def test_the_forward_pass_compiles_whole_without_host_syncs():
    """fullgraph=True fails on any graph break: `.item()`, `bool(tensor)`, boolean-mask indexing, nonzero.

    The `eager` backend runs dynamo's tracing (where breaks are found) without inductor's code generation;
    tests/test_engine.py::test_inductor_compiled_training_step_equals_eager (slow) runs the real compiler.
    """
    torch.manual_seed(0)
    model = bertforge.BertForPreTraining(BertConfig(**TINY))
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    batch = pretraining_batch(seed=1)
    packed = dict(packing=Packing.from_attention_mask(batch["attention_mask"]),
                  masked_positions=masked_positions_from(batch["labels"]))
    for mode in ("train", "eval"):
        getattr(model, mode)()
        for extra in ({}, packed):
            torch.manual_seed(0)
            expected = model(**batch, masked_only=True, **extra)
            torch.manual_seed(0)
            actual = compiled(**batch, masked_only=True, **extra)
            actual.loss.backward()
            torch.testing.assert_close(actual.loss, expected.loss)
    model.eval()
    output = torch.compile(model.bert, fullgraph=True, backend="eager")(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(output.last_hidden_state, model.bert(batch["input_ids"], batch["attention_mask"])
                               .last_hidden_state)


@pytest.mark.slow  # inductor compiles forward and backward: 1-2 minutes on one CPU core
def test_inductor_compiled_training_step_equals_eager():
    torch.manual_seed(0)
    model = bertforge.BertForPreTraining(BertConfig(**TINY)).train()
    compiled = torch.compile(model, fullgraph=True)
    batch = pretraining_batch(seed=2)
    extra = dict(packing=Packing.from_attention_mask(batch["attention_mask"]),
                 masked_positions=masked_positions_from(batch["labels"]), masked_only=True)
    grads = []
    for forward in (model, compiled):
        model.zero_grad()
        forward(**batch, **extra).loss.backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    for key, grad in grads[0].items():
        torch.testing.assert_close(grads[1][key], grad, atol=1e-5, rtol=1e-4, msg=key)


def test_parameter_names_are_the_checkpoint_names():
    """named_parameters(), state_dict() and gradients say what every BERT checkpoint says: query/key/value."""
    torch.manual_seed(0)
    model = bertforge.BertModel(BertConfig(**TINY))
    named, state = dict(model.named_parameters()), model.state_dict()
    assert sorted(named) == sorted(state)
    prefix = "encoder.layer.1.attention.self."
    assert {f"{prefix}{n}.{kind}" for n in ("query", "key", "value") for kind in ("weight", "bias")} <= set(named)
    other = bertforge.BertModel(BertConfig(**TINY))
    assert str(other.load_state_dict(state, strict=True)) == "<All keys matched successfully>"
    torch.testing.assert_close(other.encoder.layer[1].attention.self.key.weight, named[f"{prefix}key.weight"])
