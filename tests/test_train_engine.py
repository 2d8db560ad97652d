"""The loop's engine parts on CPU: batches made ahead with exact positions, statistics read back only
at log steps, device/precision choice, fused AdamW, and the torchrun device check."""
import signal
import time

import pytest
import torch

import bertforge
from bertforge import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel
from bertforge.errors import BertforgeError, TrainingInterrupted
from bertforge.engine import devices
from bertforge.train import loop
from bertforge.train.batches import ShuffledBatches
from bertforge.train.checkpointing import list_checkpoints
from bertforge.train.config import TrainConfig
from bertforge.tasks.retrieval.bi_encoder import BiEncoder
from bertforge.train.loop import precision_of, train
from bertforge.train.optim import build_optimizer
from bertforge.train.prefetch import Prefetcher, accepts_packing


def counting_batches(size=40, batch_size=4, seq=6, fail_at=None):
    """ShuffledBatches whose rows are padded to random lengths (so packing pays), optionally failing once."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 50, (size, seq), generator=generator)
    lengths = torch.randint(2, seq + 1, (size,), generator=generator)
    calls = {"n": 0}

    def collate(indices):
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise ValueError("row 7 has no text")
        mask = (torch.arange(seq)[None] < lengths[indices][:, None]).long()
        return {"input_ids": ids[indices] * mask, "attention_mask": mask, "labels": (ids[indices, 0] > 25).long()}

    return ShuffledBatches(size, batch_size, collate, seed=3)


def test_prefetched_positions_are_where_the_loop_stands_not_the_thread():
    batches = counting_batches()
    stream = Prefetcher.for_model(batches, torch.nn.Linear(1, 1), torch.device("cpu"))
    taken = [stream.next_batch() for _ in range(3)]
    deadline = time.time() + 5
    while stream.producer.ready.qsize() < 2 and time.time() < deadline:  # let the thread run ahead
        time.sleep(0.01)
    assert batches.state_dict()["batches_done"] > 3  # the thread is ahead of the loop...
    assert stream.state_dict() == {"epoch": 0, "batches_done": 3}  # ...the saved position is not
    stream.close()
    assert stream.producer.finished.is_set()  # the thread has left the batches: it only has to return
    stream.producer.thread.join(timeout=5)
    assert not stream.producer.thread.is_alive()

    again = counting_batches()
    again.load_state_dict(stream.state_dict())
    resumed = Prefetcher.for_model(again, torch.nn.Linear(1, 1), torch.device("cpu"))
    fresh = iter(counting_batches())
    expected = [next(fresh) for _ in range(4)][3]
    assert torch.equal(resumed.next_batch()["input_ids"], expected["input_ids"])  # the very next batch
    resumed.close()
    assert len(taken) == 3


def test_batches_are_packed_on_the_host_only_for_models_that_take_it():
    model = bertforge.BertForSequenceClassification(BertConfig.from_preset("tiny", vocab_size=60))
    assert accepts_packing(model) and not accepts_packing(torch.nn.Linear(1, 1))
    stream = Prefetcher.for_model(counting_batches(), model, torch.device("cpu"))
    batch = stream.next_batch()
    stream.close()
    packing = batch["packing"]
    assert packing.cu_seqlens[-1] == batch["attention_mask"].sum() and packing.token_indices.device.type == "cpu"
    plain = Prefetcher.for_model(counting_batches(), torch.nn.Linear(1, 1), torch.device("cpu"))
    assert "packing" not in plain.next_batch()
    plain.close()


def test_an_error_in_the_thread_reaches_the_loop():
    stream = Prefetcher(counting_batches(fail_at=3))
    stream.next_batch(), stream.next_batch()
    with pytest.raises(ValueError, match="row 7 has no text"):
        stream.next_batch()
    stream.close()


def test_the_run_log_shows_data_wait_and_reads_statistics_only_at_log_steps(tmp_path, monkeypatch):
    """On a GPU every read (`.cpu()`, `.item()`) waits for the device: micro-steps make none."""
    reads, in_step = [], {"now": False}
    real_cpu, real_item, real_accumulate = torch.Tensor.cpu, torch.Tensor.item, loop.accumulate_gradients
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **k: reads.append(("cpu", self.shape, in_step["now"]))
                        or real_cpu(self, *a, **k))
    monkeypatch.setattr(torch.Tensor, "item", lambda self: reads.append(("item", self.shape, in_step["now"]))
                        or real_item(self))

    def accumulate(*args, **kwargs):
        in_step["now"] = True
        real_accumulate(*args, **kwargs)
        in_step["now"] = False

    monkeypatch.setattr(loop, "accumulate_gradients", accumulate)
    torch.manual_seed(0)
    model = bertforge.BertForSequenceClassification(BertConfig.from_preset("tiny", vocab_size=60))
    config = TrainConfig(output_dir=str(tmp_path), max_steps=6, log_every=3, learning_rate=1e-3,
                         tensorboard=False, plot=False)
    records = train(model, counting_batches(), config)
    logged = [r for r in records if "loss" in r]
    assert [r["step"] for r in logged] == [3, 6]
    assert all(0 <= r["data_wait"] < 1 and r["tokens_per_s"] > 0 for r in logged)
    assert not [read for read in reads if read[2]]  # forward, backward and statistics: nothing read back
    assert [read for read in reads if read[:2] == ("cpu", (2, 2))] == [("cpu", (2, 2), False)] * 2  # one per log


def one_layer(hidden_size: int) -> BertConfig:
    return BertConfig(vocab_size=99, hidden_size=hidden_size, num_hidden_layers=1, num_attention_heads=4,
                      intermediate_size=37, max_position_embeddings=16)


def test_auto_precision_and_device(monkeypatch):
    config = TrainConfig()
    assert (config.precision, config.device) == ("auto", "auto")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert precision_of(config, torch.device("cpu")) == "fp32"  # bf16 without AMX is emulated: slower
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert precision_of(config, torch.device("cpu")) == "bf16"
    assert precision_of(TrainConfig(precision="fp32"), torch.device("cpu")) == "fp32"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert precision_of(config, torch.device("cuda")) == "bf16"
    # on a GPU bf16 pays from BERT-base width; below it a step is host-bound and autocast's casts cost more
    assert precision_of(config, torch.device("cuda"), BertForMaskedLM(one_layer(256))) == "fp32"
    assert precision_of(config, torch.device("cuda"), BertForMaskedLM(one_layer(768))) == "bf16"
    assert precision_of(config, torch.device("cuda"), BiEncoder(BertModel(one_layer(384)))) == "fp32"
    assert precision_of(TrainConfig(precision="bf16"), torch.device("cuda"), BiEncoder(BertModel(one_layer(64)))) == "bf16"
    assert precision_of(TrainConfig(precision="fp32"), torch.device("cuda")) == "fp32"
    with pytest.raises(ValueError, match="device='tpu'"):
        TrainConfig(device="tpu")


def test_torchrun_with_more_processes_than_gpus_names_the_fix(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(BertforgeError, match=r"2 processes .* 1 GPU.*--nproc_per_node 1.*training.device=cpu"):
        devices.select_device("auto")
    assert devices.select_device("cpu") == torch.device("cpu")  # gloo, when asked
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert devices.select_device("auto") == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.select_device("auto") == torch.device("cpu")
    with pytest.raises(BertforgeError, match="no GPU"):
        devices.select_device("cuda")


def test_fused_adamw_takes_the_same_steps_as_the_default():
    """The loop asks for the fused kernel on CUDA; torch has it on CPU too, so its updates are checked here."""
    torch.manual_seed(0)
    models = [bertforge.BertForSequenceClassification(BertConfig.from_preset("tiny", vocab_size=60)).eval()
              for _ in range(2)]  # eval: no dropout, so both see the same gradients
    models[1].load_state_dict(models[0].state_dict())
    optimizers = [build_optimizer(models[0], 1e-2), build_optimizer(models[1], 1e-2, fused=True)]
    assert optimizers[1].defaults["fused"] and not optimizers[0].defaults["fused"]
    ids = torch.randint(5, 60, (4, 8), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        for model, optimizer in zip(models, optimizers):
            model(ids, labels=torch.tensor([0, 1, 1, 0])).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    # Steps are ~1e-2; the key bias, whose true gradient is 0 (softmax ignores it), moves by rounding noise
    # over eps, which the two kernels round differently: ~1e-6.
    for (name, fused), plain in zip(models[1].named_parameters(), models[0].parameters()):
        torch.testing.assert_close(fused, plain, atol=1e-5, rtol=1e-5, msg=name)


def test_a_stop_requested_at_the_last_step_saves_the_end_and_still_stops():
    config = TrainConfig(max_steps=5, save_every=0, eval_every=0)
    cpu = torch.device("cpu")
    last = loop.due_at(5, config, stop_requested=True, can_evaluate=True, device=cpu)
    assert last.end and last.saving and last.evaluating and last.stopping  # the caller must not carry on
    assert not loop.due_at(5, config, stop_requested=False, can_evaluate=True, device=cpu).stopping
    middle = loop.due_at(3, config, stop_requested=True, can_evaluate=True, device=cpu)
    assert middle.stopping and middle.saving and not middle.end


def test_a_ctrl_c_before_the_first_step_closes_the_bar(tmp_path, capsys):
    """Ctrl-C during the evaluation at the start: the bar was left open until the process exited, so it was drawn
    again after "bertforge: interrupted" and the message shared the bar's line."""
    def interrupted(model):
        raise KeyboardInterrupt

    config = TrainConfig(output_dir=str(tmp_path / "run"), max_steps=4, eval_at_start=True, eval_every=2,
                         plot=False, tensorboard=False)
    err = "not interrupted"
    try:
        train(BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                       num_attention_heads=2, intermediate_size=32)),
              counting_batches(), config, evaluate=interrupted)
    except KeyboardInterrupt:  # read here, as the CLI reports it: the traceback keeps the loop's frame alive
        err = capsys.readouterr().err
    assert err.endswith("\n") and "train:" in err  # the bar drew its last state and ended its line


def test_a_ctrl_c_during_the_last_evaluation_stops_the_command_after_the_saved_end(tmp_path):
    """The loop asks for stop requests before a step's evaluation and save; one that came during the last step's
    evaluation was dropped when the loop ended, and adapt went on to its next stage (found by a Ctrl-C fuzz: the
    process ran on for minutes). Now the finished, saved run ends as interrupted."""
    evaluated = []

    def ctrl_c_at_the_end(model):
        evaluated.append(True)
        if len(evaluated) == 2:  # step 4 of 4 (every 2 steps)
            signal.raise_signal(signal.SIGINT)
        return {"score": 1.0}

    config = TrainConfig(output_dir=str(tmp_path / "run"), max_steps=4, eval_every=2, eval_at_start=False,
                         save_every=0, plot=False, tensorboard=False)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN in a test worker started in the background
    with pytest.raises(TrainingInterrupted, match="interrupted by SIGINT at step 4; saved .*step-000004"):
        train(BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                       num_attention_heads=2, intermediate_size=32)),
              counting_batches(), config, evaluate=ctrl_c_at_the_end)
    assert signal.getsignal(signal.SIGINT) is before  # given back
    assert [c.name for c in list_checkpoints(tmp_path / "run")] == ["step-000004"]
