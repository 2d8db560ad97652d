"""What `bertforge adapt --query-generator` costs here: seconds per passage for the two doc2query sizes.

    python scripts/query_generation_speed.py

Random weights in the shapes of t5-small and t5-base (the cost only: no model hub here), 8 passages of 200 tokens,
3 sampled queries of 16 tokens each, as adapt draws them (pseudo_queries.QuerySettings).
"""
from __future__ import annotations

import time

import torch
import transformers

SHAPES = {"t5-small": dict(d_model=512, d_ff=2048, num_layers=6, num_heads=8, d_kv=64),
          "t5-base": dict(d_model=768, d_ff=3072, num_layers=12, num_heads=12, d_kv=64)}
PASSAGES, PASSAGE_TOKENS, QUERY_TOKENS, QUERIES = 8, 200, 16, 3
CORPUS = 1_435  # Python's FAQ set (scripts/python_faq_set.py)


def seconds_per_passage(shape: dict) -> float:
    config = transformers.T5Config(vocab_size=32128, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                                   **shape)
    model = transformers.T5ForConditionalGeneration(config).eval()
    ids = torch.randint(5, 32000, (PASSAGES, PASSAGE_TOKENS))
    sampling = dict(do_sample=True, top_p=0.95, num_return_sequences=QUERIES)
    with torch.inference_mode():
        model.generate(input_ids=ids[:2], max_new_tokens=4, **sampling)  # first calls' setup, not timed
        started = time.perf_counter()
        model.generate(input_ids=ids, min_new_tokens=QUERY_TOKENS, max_new_tokens=QUERY_TOKENS, **sampling)
    return (time.perf_counter() - started) / PASSAGES


def main() -> None:
    torch.manual_seed(0)
    for name, shape in SHAPES.items():
        seconds = seconds_per_passage(shape)
        print(f"{name}: {seconds:.2f} s a passage ({PASSAGES} passages of {PASSAGE_TOKENS} tokens, {QUERIES} queries "
              f"of {QUERY_TOKENS} tokens), {torch.get_num_threads()} threads; {CORPUS:,} passages: "
              f"{seconds * CORPUS / 60:.1f} min")


if __name__ == "__main__":
    main()
