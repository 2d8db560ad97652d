"""The CUDA paths: real checkpoints on the GPU, the packed attention kernel, a forward pass with
no host sync, a bf16 training step, predict, and torchrun (NCCL with 2 GPUs; the clear error with 1).

Every test here is marked `gpu` and skipped where torch sees no GPU (tests/conftest.py).
"""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import transformers
import yaml

import bertforge
from bertforge import BertConfig, BertModel
from bertforge.engine.attention import attention, packed_kernel
from bertforge.engine.unpadding import Packing, unpad
from bertforge.models.heads import masked_positions_from
from bertforge.train.batches import predict_rows
from bertforge.train.config import TrainConfig
from bertforge.train.loop import train
from test_pretrain import write_recipe

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
TINY = dict(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=96,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def batch_of(lengths, seq, vocab=99, seed=0, device=CUDA):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(seq)[None] < torch.tensor(lengths)[:, None]).long()
    labels = torch.randint(0, vocab, (len(lengths), seq), generator=g)
    labels[(torch.rand(len(lengths), seq, generator=g) > 0.3) | ~mask.bool()] = -100
    batch = dict(input_ids=torch.randint(1, vocab, (len(lengths), seq), generator=g) * mask, attention_mask=mask,
                 labels=labels, next_sentence_label=torch.randint(0, 2, (len(lengths),), generator=g))
    extra = dict(packing=Packing.from_attention_mask(mask), masked_positions=masked_positions_from(labels))
    return {k: v.to(device) for k, v in batch.items()}, {k: v.to(device) for k, v in extra.items()}


def test_minilm_on_cuda_matches_transformers_on_cpu(minilm_dir):
    tokenizer = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir))
    batch = tokenizer(["A short one.", "Anne sighed, and looked out over the sea for a long while."],
                      padding=True, return_tensors="pt")
    reference = transformers.BertModel.from_pretrained(str(minilm_dir)).eval()
    ours = BertModel.from_pretrained(minilm_dir).to(CUDA)
    with torch.no_grad():
        expected = reference(**batch).last_hidden_state
        actual = ours(**{k: v.to(CUDA) for k, v in batch.items()}).last_hidden_state.cpu()
    valid = batch["attention_mask"].bool()
    torch.testing.assert_close(actual[valid], expected[valid], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype, dropout_p", [(torch.bfloat16, 0.0), (torch.float32, 0.0), (torch.bfloat16, 0.1)])
def test_packed_cuda_attention_equals_padded_sdpa(dtype, dropout_p):
    g = torch.Generator().manual_seed(0)
    mask = (torch.arange(40)[None] < torch.tensor([40, 7, 23, 1, 33])[:, None])
    packing = Packing.from_attention_mask(mask).to(CUDA)
    padded = [torch.randn(5, 40, 4, 64, generator=g).to(CUDA, dtype).requires_grad_() for _ in range(3)]
    packed = [unpad(t.detach(), packing).requires_grad_() for t in padded]
    assert packed_kernel(packed[0]) == "repadded"
    with torch.no_grad():  # inference on CUDA too: length grouping is for the CPU
        assert packed_kernel(packed[0]) == "repadded"
    if dropout_p:  # random masks differ between kernels: check it runs, drops, and back-propagates
        context, _ = attention(*packed, packing=packing, dropout_p=dropout_p)
        context.float().sum().backward()
        assert torch.isfinite(packed[0].grad).all()
        return
    expected, _ = attention(*padded, key_mask=packing.key_mask)
    actual, _ = attention(*packed, packing=packing)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(actual.float(), unpad(expected, packing).float(), atol=tolerance, rtol=tolerance)
    weights = torch.randn(actual.shape, generator=g).to(CUDA, dtype)
    (actual * weights).sum().backward()
    (unpad(expected, packing) * weights).sum().backward()
    for ours, reference in zip(packed, padded):
        torch.testing.assert_close(ours.grad.float(), unpad(reference.grad, packing).float(), atol=5 * tolerance,
                                   rtol=5 * tolerance)


def test_unpadded_model_equals_padded_on_cuda_fp32():
    torch.manual_seed(0)
    model = bertforge.BertForPreTraining(BertConfig(**TINY)).to(CUDA).train()
    batch, extra = batch_of([9, 4, 7, 2], seq=9)
    padded = model(**batch, masked_only=True)
    packed = model(**batch, masked_only=True, **extra)
    torch.testing.assert_close(packed.loss, padded.loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed.prediction_logits, padded.prediction_logits, atol=1e-5, rtol=1e-5)


def test_the_forward_pass_never_waits_for_the_gpu():
    """With packing and masked positions from the host, no op in forward may synchronise (sync debug mode)."""
    torch.manual_seed(0)
    model = bertforge.BertForPreTraining(BertConfig(**TINY)).to(CUDA).train()
    batch, extra = batch_of([9, 4, 7, 2], seq=9)
    model(**batch, masked_only=True, **extra)  # warm-up: first-call set-up may sync
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            output = model(**batch, masked_only=True, **extra)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(output.loss)


def classification_batches():
    from bertforge.train.batches import ShuffledBatches

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 99, (64, 12), generator=g)
    lengths = torch.randint(3, 13, (64,), generator=g)

    def collate(indices):
        mask = (torch.arange(12)[None] < lengths[indices][:, None]).long()
        return {"input_ids": ids[indices] * mask, "attention_mask": mask, "labels": (ids[indices, 0] > 50).long()}

    return ShuffledBatches(64, 16, collate), lengths, collate


def test_a_bf16_training_step_and_predict_on_cuda(tmp_path):
    torch.manual_seed(0)
    model = bertforge.BertForSequenceClassification(BertConfig(**TINY))
    batches, lengths, collate = classification_batches()
    config = TrainConfig(output_dir=str(tmp_path), max_steps=4, log_every=2, learning_rate=1e-3,
                         tensorboard=False, plot=False)
    records = train(model, batches, config, device=CUDA)  # precision auto: bf16 on the GPU
    logged = [r for r in records if "loss" in r]
    assert len(logged) == 2 and all(r["loss"] == r["loss"] and 0 <= r["data_wait"] < 1 for r in logged)
    on_gpu = predict_rows(model, lengths.tolist(), collate, device=CUDA)
    on_cpu = predict_rows(model.cpu(), lengths.tolist(), collate)
    for gpu_row, cpu_row in zip(on_gpu, on_cpu):
        assert abs(gpu_row - cpu_row).max() < 1e-4


def torchrun(recipe_path, processes=2):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                           "--master_port", "29547", "-m", "bertforge.cli", "pretrain", "--config", str(recipe_path)],
                          capture_output=True, text=True, env=env)


def test_torchrun_with_more_processes_than_gpus_is_a_clear_error(corpus_files, tmp_path):
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has a GPU for each of 2 processes")
    result = torchrun(write_recipe(tmp_path, corpus_files, max_steps=2))
    assert result.returncode != 0
    assert "bertforge: error: torchrun started 2 processes" in result.stderr
    assert f"--nproc_per_node {torch.cuda.device_count()}" in result.stderr


def test_two_nccl_processes_train_together(corpus_files, tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    recipe = write_recipe(tmp_path, corpus_files, max_steps=4, save_every=0, device="cuda")
    result = torchrun(recipe)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4]
    assert yaml.safe_load(recipe.read_text())["training"]["device"] == "cuda"


def graphed_recipe(folder, corpus_files, graphs: bool, **training):
    """The pretraining test recipe on the GPU in fp32, dropout off (eager and replayed kernels draw their noise
    differently), with the training step replayed from a CUDA graph or not."""
    folder.mkdir()
    path = write_recipe(folder, corpus_files, device="cuda", precision="fp32", cuda_graphs=graphs, **training)
    recipe = yaml.safe_load(path.read_text())
    recipe["model"]["overrides"].update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_a_pretraining_run_replayed_from_a_cuda_graph_trains_as_eager_steps_do(corpus_files, tmp_path, caplog):
    from bertforge.cli.parser import main
    from test_pretrain import losses

    runs = {}
    for graphs in (False, True):
        recipe = graphed_recipe(tmp_path / f"graphs-{graphs}", corpus_files, graphs, max_steps=12, save_every=6)
        caplog.clear()
        assert main(["pretrain", "--config", str(recipe)]) == 0
        runs[graphs] = losses(tmp_path / f"graphs-{graphs}" / "run")
        said = [record.getMessage() for record in caplog.records]  # the bertforge logger's lines
        assert any("replay one CUDA graph" in line for line in said) == graphs, said
    assert sorted(runs[True]) == list(range(1, 13))
    # Steps 4 on are replayed (3 eager warm-up steps), with a schedule that moves every step (warm-up, decay).
    for step, loss in runs[False].items():
        assert runs[True][step] == pytest.approx(loss, rel=2e-3), step

    # Resumed from step 6, the replayed run goes on as it went (warm-up and capture again after the resume).
    run = tmp_path / "graphs-True" / "run"
    shutil.rmtree(run / "step-000012")
    assert main(["pretrain", "--config", str(tmp_path / "graphs-True" / "recipe.yaml"), "--resume"]) == 0
    resumed = losses(run)
    for step in range(7, 13):
        assert resumed[step] == pytest.approx(runs[True][step], rel=1e-4), step


def test_the_hybrid_teacher_term_on_cuda_equals_cpu_and_never_waits_for_the_gpu():
    """adapt's ICT teacher (cosines re-ranked by BM25's scores, `fused_rows`) runs every step: on the GPU it may not
    synchronise with the host, and it must give the CPU's loss."""
    from bertforge.tasks.retrieval.losses import score_distillation_loss

    g = torch.Generator().manual_seed(0)
    student = [torch.randn(16, 32, generator=g, requires_grad=True) for _ in range(2)]
    teacher = [torch.randn(16, 32, generator=g) for _ in range(2)]
    lexical = torch.rand(16, 16, generator=g) * 10
    options = dict(symmetric=True, documents=0.5, lexical=lexical, lexical_share=0.3)
    expected = score_distillation_loss(*student, *teacher, **options)
    on_gpu = [t.detach().to(CUDA).requires_grad_(t.requires_grad) for t in student + teacher]
    options["lexical"] = lexical.to(CUDA)
    score_distillation_loss(*on_gpu, **options)  # warm-up: first-call set-up may sync
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = score_distillation_loss(*on_gpu, **options)
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(loss.cpu(), expected.detach(), atol=1e-5, rtol=1e-5)
    assert torch.isfinite(on_gpu[0].grad).all()
