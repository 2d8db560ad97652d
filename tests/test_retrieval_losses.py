"""Sentence-encoder losses equal sentence-transformers' on the same vectors; the gradient cache equals no cache."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bertforge.models.config import BertConfig
from bertforge.models.model import BertModel
from bertforge.tasks.retrieval.bi_encoder import BiEncoder, Objective
from bertforge.tasks.retrieval.losses import (cosent_loss, cosine_similarity_loss, fused_rows, matryoshka,
                                              multiple_negatives_ranking_loss, score_distillation_loss)

st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")

BATCH, DIM = 13, 37


def vectors(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("with_negatives", [False, True])
@pytest.mark.parametrize("symmetric", [False, True])
def test_mnrl_equals_sentence_transformers(with_negatives, symmetric):
    anchors, positives = vectors(BATCH, DIM, seed=0), vectors(BATCH, DIM, seed=1)
    negatives = vectors(BATCH, DIM, seed=2) if with_negatives else None
    directions = ("query_to_doc", "doc_to_query") if symmetric else ("query_to_doc",)
    reference = st_losses.MultipleNegativesRankingLoss(None, scale=20.0, directions=directions,
                                                       partition_mode="per_direction" if symmetric else "joint")
    columns = [anchors, positives] + ([negatives] if with_negatives else [])
    expected = reference.compute_loss_from_embeddings(columns, None)
    ours = multiple_negatives_ranking_loss(anchors, positives, negatives, scale=20.0, symmetric=symmetric)
    torch.testing.assert_close(ours, expected)


def test_mnrl_is_small_when_each_anchor_is_its_positive_and_large_when_shuffled():
    anchors = vectors(BATCH, DIM, seed=3)
    assert multiple_negatives_ranking_loss(anchors, anchors.clone()) < 0.1
    assert multiple_negatives_ranking_loss(anchors, anchors.roll(1, dims=0)) > 5


def test_cosent_and_cosine_equal_sentence_transformers():
    first, second = vectors(BATCH, DIM, seed=4), vectors(BATCH, DIM, seed=5)
    scores = torch.tensor([0, 1, 2, 2, 0, 1, 0.5, 2, 1, 0, 0, 2, 1.0])
    expected = st_losses.CoSENTLoss(None, scale=20.0).compute_loss_from_embeddings([first, second], scores)
    torch.testing.assert_close(cosent_loss(first, second, scores, scale=20.0), expected)
    mse = st_losses.CosineSimilarityLoss(None).compute_loss_from_embeddings([first, second], scores / 2)
    torch.testing.assert_close(cosine_similarity_loss(first, second, scores / 2), mse)


def test_cosent_is_zero_when_the_order_is_already_right_by_far():
    base = vectors(3, DIM, seed=6)
    first = base
    second = torch.stack([base[0], base[1] * 0.5 + vectors(DIM, seed=7), -base[2]])  # cosines high, mid, low
    assert cosent_loss(first, second, torch.tensor([2.0, 1.0, 0.0]), scale=1000.0) < 1e-6
    assert cosent_loss(first, second, torch.tensor([0.0, 1.0, 2.0]), scale=20.0) > 10


def tiny_bi_encoder(objective: Objective, dropout: float = 0.0) -> BiEncoder:
    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    torch.manual_seed(0)
    bert = BertModel(config)
    bert.init_weights()
    return BiEncoder(bert, pooling="mean", objective=objective).train()


def tiny_batch(with_negatives=True, seed=8):
    generator = torch.Generator().manual_seed(seed)
    batch = {}
    for name in ("anchor", "positive") + (("negative",) if with_negatives else ()):
        ids = torch.randint(5, 99, (BATCH, 7), generator=generator)
        lengths = torch.randint(2, 8, (BATCH,), generator=generator)
        mask = (torch.arange(7)[None, :] < lengths[:, None]).long()
        batch[f"{name}_input_ids"], batch[f"{name}_attention_mask"] = ids * mask, mask
    return batch


def test_matryoshka_equals_sentence_transformers_end_to_end(tmp_path):
    """Our bi-encoder's Matryoshka-MNRL loss = ST's MatryoshkaLoss(MNRL) on ST's load of our saved folder."""
    from sentence_transformers import SentenceTransformer

    from bertforge.tokenization.tokenizer import BertTokenizer

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(94)]
    tokenizer = BertTokenizer.from_vocab({t: i for i, t in enumerate(tokens)})
    model = tiny_bi_encoder(Objective(loss="mnrl", matryoshka_dims=[32, 16, 8])).eval()
    model.save_pretrained(tmp_path / "st", tokenizer=tokenizer)
    batch = tiny_batch()
    with torch.no_grad():
        ours = model(**batch).loss
    reference_model = SentenceTransformer(str(tmp_path / "st"), device="cpu").eval()
    loss = st_losses.MatryoshkaLoss(reference_model, st_losses.MultipleNegativesRankingLoss(reference_model),
                                    matryoshka_dims=[32, 16, 8])
    features = [{"input_ids": batch[f"{n}_input_ids"], "attention_mask": batch[f"{n}_attention_mask"],
                 "token_type_ids": torch.zeros_like(batch[f"{n}_input_ids"])} for n in ("anchor", "positive", "negative")]
    with torch.no_grad():
        expected = loss(features, None)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    # and the slices matter: a single full-width term is a different number
    with torch.no_grad():
        full_width = multiple_negatives_ranking_loss(*[model.sentence_vectors(
            batch[f"{n}_input_ids"], batch[f"{n}_attention_mask"]) for n in ("anchor", "positive", "negative")])
    assert abs(float(ours) - float(full_width)) > 1e-3


def test_matryoshka_passes_scores_through():
    first, second = vectors(BATCH, DIM, seed=9), vectors(BATCH, DIM, seed=10)
    scores = torch.linspace(0, 1, BATCH)
    summed = matryoshka(cosine_similarity_loss, [DIM, 8])(first, second, scores)
    expected = cosine_similarity_loss(first, second, scores) + cosine_similarity_loss(first[:, :8], second[:, :8], scores)
    torch.testing.assert_close(summed, expected)


def parameter_gradients(model, batch, scale=1.0):
    model.zero_grad()
    (model(**batch).loss * scale).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("loss", ["mnrl", "cosent"])
def test_gradient_cache_gives_the_whole_batch_gradients(loss):
    batch = tiny_batch(with_negatives=loss == "mnrl")
    if loss == "cosent":
        batch["scores"] = torch.arange(BATCH, dtype=torch.float32) % 3
    plain = tiny_bi_encoder(Objective(loss=loss))
    cached = tiny_bi_encoder(Objective(loss=loss, mini_batch_size=4))
    torch.testing.assert_close(cached(**batch).loss, plain(**batch).loss)
    expected, got = parameter_gradients(plain, batch, 0.5), parameter_gradients(cached, batch, 0.5)
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-6)


def test_gradient_cache_replays_dropout():
    """With dropout on, the cached backward reproduces the masks of the first pass: its gradients equal
    those of embedding the same mini-batches, in the same order, with autograd."""
    batch = tiny_batch(with_negatives=False)
    cached = tiny_bi_encoder(Objective(mini_batch_size=5), dropout=0.3)
    torch.manual_seed(123)
    got = parameter_gradients(cached, batch)

    reference = tiny_bi_encoder(Objective(), dropout=0.3)
    reference.zero_grad()
    torch.manual_seed(123)
    from bertforge.tasks.retrieval.gradient_cache import mini_batches
    columns = [(batch[f"{n}_input_ids"], batch[f"{n}_attention_mask"]) for n in ("anchor", "positive")]
    vectors_by_column = [torch.cat([reference.sentence_vectors(*part) for part in mini_batches(column, 5)])
                         for column in columns]
    multiple_negatives_ranking_loss(*vectors_by_column).backward()
    for name, parameter in reference.named_parameters():
        if parameter.grad is not None:
            torch.testing.assert_close(got[name], parameter.grad, rtol=1e-4, atol=1e-6)


def test_scored_losses_refuse_pairs_without_scores():
    model = tiny_bi_encoder(Objective(loss="cosent"))
    with pytest.raises(ValueError, match="needs gold scores"):
        model(**tiny_batch(with_negatives=False))


@pytest.mark.parametrize("settings, message", [
    ({"loss": "triplet"}, "not one of"),
    ({"loss": "cosent", "symmetric": True}, "mnrl only"),
    ({"scale": 0.0}, "loss.scale must be greater than 0, got 0.0"),
    ({"mini_batch_size": -1}, "loss.mini_batch_size must be at least 0, got -1"),
    ({"matryoshka_dims": [64, 0]}, "loss.matryoshka_dims must be at least 1, got 0"),
    ({"distillation": -1.0}, r"loss.distillation must be at least 0, got -1.0 \(0: no teacher term\)"),
    ({"loss": "cosent", "distillation": 1.0}, "distillation is a weight of the mnrl loss's teacher term"),
])
def test_objective_rejects_bad_settings(settings, message):
    with pytest.raises(ValueError, match=message):
        Objective(**settings)


def test_matryoshka_wider_than_the_model_is_refused():
    with pytest.raises(ValueError, match="exceed the model's 32 dimensions"):
        tiny_bi_encoder(Objective(matryoshka_dims=[64, 16]))


@pytest.mark.parametrize("symmetric", [False, True])
def test_score_distillation_is_zero_for_the_teachers_own_rankings_and_equals_the_kl(symmetric):
    anchors, positives = vectors(BATCH, DIM, seed=4), vectors(BATCH, DIM, seed=5)
    assert score_distillation_loss(anchors, positives, anchors * 3, positives, symmetric=symmetric) < 1e-6
    teacher_anchors = vectors(BATCH, DIM, seed=6)
    student = torch.nn.functional.normalize(anchors, dim=-1) @ torch.nn.functional.normalize(positives, dim=-1).T
    teacher = torch.nn.functional.normalize(teacher_anchors, dim=-1) @ torch.nn.functional.normalize(positives,
                                                                                                    dim=-1).T
    p, q = (teacher * 20).softmax(-1), (student * 20).softmax(-1)
    expected = (p * (p.log() - q.log())).sum(-1).mean()
    if symmetric:
        p, q = (teacher.T * 20).softmax(-1), (student.T * 20).softmax(-1)
        expected = (expected + (p * (p.log() - q.log())).sum(-1).mean()) / 2
    got = score_distillation_loss(anchors, positives, teacher_anchors, positives, symmetric=symmetric)
    torch.testing.assert_close(got, expected)


def test_document_distillation_adds_the_kl_of_each_positives_ranking_of_the_other_positives():
    anchors, positives, teacher_positives = (vectors(BATCH, DIM, seed=seed) for seed in (4, 5, 7))
    assert score_distillation_loss(anchors, positives, anchors, positives * 2, documents=1.0) < 1e-6
    normalize = torch.nn.functional.normalize
    student, teacher = (normalize(v, dim=-1) @ normalize(v, dim=-1).T for v in (positives, teacher_positives))
    others = ~torch.eye(BATCH, dtype=torch.bool)
    p, q = ((m[others].view(BATCH, BATCH - 1) * 20).softmax(-1) for m in (teacher, student))
    documents = (p * (p.log() - q.log())).sum(-1).mean()
    pairs = score_distillation_loss(anchors, positives, anchors, teacher_positives)
    got = score_distillation_loss(anchors, positives, anchors, teacher_positives, documents=1.0)
    torch.testing.assert_close(got, pairs + documents)
    two = score_distillation_loss(anchors[:2], positives[:2], anchors[:2], teacher_positives[:2], documents=1.0)
    torch.testing.assert_close(two, score_distillation_loss(anchors[:2], positives[:2], anchors[:2],
                                                            teacher_positives[:2]))  # one other document: no ranking
    with pytest.raises(ValueError, match="give loss.distillation a weight"):
        Objective(distill_documents=1.0)


def distillation_case():
    """A batch, a bi-encoder without a teacher term, its anchor and positive vectors, and a teacher's vectors of the
    same texts that rank them otherwise (the anchors rolled by one)."""
    batch = tiny_batch(with_negatives=False)
    plain = tiny_bi_encoder(Objective())
    with torch.no_grad():
        columns = [plain.sentence_vectors(batch[f"{n}_input_ids"], batch[f"{n}_attention_mask"])
                   for n in ("anchor", "positive")]
    return batch, plain, columns, {"anchor_teacher": columns[0].roll(1, dims=0), "positive_teacher": columns[1]}


def test_bi_encoder_adds_the_weighted_distillation_term_with_and_without_the_gradient_cache():
    batch, plain, columns, teacher = distillation_case()
    task = plain(**batch).loss
    distilled = tiny_bi_encoder(Objective(distillation=0.5))
    expected = task + 0.5 * score_distillation_loss(*columns, *teacher.values())
    torch.testing.assert_close(distilled(**batch, **teacher).loss, expected)
    cached = tiny_bi_encoder(Objective(distillation=0.5, mini_batch_size=4))
    torch.testing.assert_close(cached(**batch, **teacher).loss, expected)
    with_documents = score_distillation_loss(*columns, *teacher.values(), documents=1.0)
    for mini_batch_size in (0, 4):
        model = tiny_bi_encoder(Objective(distillation=0.5, distill_documents=1.0, mini_batch_size=mini_batch_size))
        torch.testing.assert_close(model(**batch, **teacher).loss, task + 0.5 * with_documents)
    with pytest.raises(ValueError, match="needs the teacher's vectors"):
        distilled(**batch)


@pytest.mark.slow  # 18 s of both cores; the gradient cache on one process stays in make test
def test_gradient_cache_under_torchrun_steps_with_the_mean_of_the_ranks_gradients(tmp_path):
    """DistributedDataParallel refuses the cache's several backward passes a step, so the loop averages the gradients
    itself: each of 2 gloo processes steps with the mean of what each one's batch gives alone."""
    script = tmp_path / "ranked.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        import torch
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_retrieval_losses import tiny_batch, tiny_bi_encoder
        import bertforge.train.loop as loop
        from bertforge.tasks.retrieval.bi_encoder import Objective
        from bertforge.train.batches import ShuffledBatches
        from bertforge.train.config import TrainConfig
        from bertforge.train.distributed import init_distributed
        rank = int(os.environ["RANK"])
        stepped = loop.optimizer_step
        def captured(model, *rest):
            torch.save({{n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}},
                       {str(tmp_path)!r} + f"/grad{{rank}}.pt")
            return stepped(model, *rest)
        loop.optimizer_step = captured
        model = tiny_bi_encoder(Objective(mini_batch_size=4))
        batches = ShuffledBatches(8, 8, lambda indices: tiny_batch(seed=100 + rank))
        config = TrainConfig(output_dir={str(tmp_path / "run")!r}, max_steps=1, precision="fp32", device="cpu",
                             tensorboard=False, plot=False)
        loop.train(model, batches, config, topology=init_distributed(torch.device("cpu")))
    """))
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(script)], capture_output=True, text=True, timeout=240,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"grad{rank}.pt") for rank in (0, 1)]
    alone = [parameter_gradients(tiny_bi_encoder(Objective()), tiny_batch(seed=100 + rank)) for rank in (0, 1)]
    assert ranks[0].keys() == alone[0].keys()
    for name in alone[0]:
        mean = (alone[0][name] + alone[1][name]) / 2
        torch.testing.assert_close(ranks[0][name], mean, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(ranks[1][name], mean, rtol=1e-4, atol=1e-6)


def test_a_lexical_teacher_reranks_each_row_within_the_dense_teachers_range():
    anchors, positives, teacher_anchors = (vectors(BATCH, DIM, seed=seed) for seed in (4, 5, 6))
    lexical = vectors(BATCH, BATCH, seed=8).abs() * 10  # BM25-like: >= 0, another scale than cosines
    plain = score_distillation_loss(anchors, positives, teacher_anchors, positives, symmetric=True)
    unused = score_distillation_loss(anchors, positives, teacher_anchors, positives, symmetric=True,
                                     lexical=lexical, lexical_share=0.0)
    torch.testing.assert_close(unused, plain)
    cosines = (torch.nn.functional.normalize(teacher_anchors, dim=-1)
               @ torch.nn.functional.normalize(positives, dim=-1).T)
    fused = fused_rows(cosines, lexical, 1.0)  # BM25's order, the teacher's spread
    assert torch.equal(fused.argsort(dim=-1), lexical.argsort(dim=-1))
    torch.testing.assert_close(fused.amin(-1), cosines.amin(-1))
    torch.testing.assert_close(fused.amax(-1), cosines.amax(-1))
    half = fused_rows(cosines, lexical, 0.5)
    torch.testing.assert_close(half, (cosines + fused) / 2)  # linear in the share
    from bertforge.tasks.retrieval.hybrid import fuse  # the rule the index ranks by, on the cosines' range
    low, high = cosines.amin(-1, keepdim=True), cosines.amax(-1, keepdim=True)
    torch.testing.assert_close(fused_rows(cosines, lexical, 0.3),
                               low + (high - low) * torch.from_numpy(fuse(cosines.numpy(), lexical.numpy(), 0.7)))
    # The student that ranks as the fused teacher does pays nothing; each direction fuses its own rows.
    student_anchors = vectors(BATCH, DIM, seed=9)
    p = (fused_rows(cosines, lexical, 0.3) * 20).softmax(-1)
    student = (torch.nn.functional.normalize(student_anchors, dim=-1)
               @ torch.nn.functional.normalize(positives, dim=-1).T * 20)
    q = student.softmax(-1)
    forward = (p * (p.log() - q.log())).sum(-1).mean()
    pt, qt = (fused_rows(cosines.T, lexical.T, 0.3) * 20).softmax(-1), student.T.softmax(-1)
    expected = (forward + (pt * (pt.log() - qt.log())).sum(-1).mean()) / 2
    got = score_distillation_loss(student_anchors, positives, teacher_anchors, positives, symmetric=True,
                                  lexical=lexical, lexical_share=0.3)
    torch.testing.assert_close(got, expected)


def test_bi_encoder_passes_the_batchs_lexical_scores_to_the_teacher_term():
    batch, plain, columns, teacher = distillation_case()
    size = len(columns[0])
    teacher["lexical_teacher"] = vectors(size, size, seed=3).abs()
    expected = plain(**batch).loss + 0.5 * score_distillation_loss(
        *columns, teacher["anchor_teacher"], teacher["positive_teacher"], lexical=teacher["lexical_teacher"],
        lexical_share=0.4)
    for mini_batch_size in (0, 4):
        model = tiny_bi_encoder(Objective(distillation=0.5, distill_lexical=0.4, mini_batch_size=mini_batch_size))
        torch.testing.assert_close(model(**batch, **teacher).loss, expected)
    without_lexical = {k: v for k, v in teacher.items() if k != "lexical_teacher"}
    with pytest.raises(ValueError, match="needs the batch's lexical scores"):
        tiny_bi_encoder(Objective(distillation=0.5, distill_lexical=0.4))(**batch, **without_lexical)
    with pytest.raises(ValueError, match="give loss.distillation a weight"):
        Objective(distill_lexical=0.4)
