"""What `--preset quick|full` runs: the held-out query count and the training stages, sized by the corpus.

quick: one ICT stage, in-batch negatives only (mining costs a third more per step), distilled from the
starting model's in-batch rankings (so the domain is learnt without losing what the base knew; its sentence-to-passage
scores fused with BM25's as the base's engine fuses them, `with_lexical_teacher`), its
length chosen so a ~150k-word corpus trains
in ~12 minutes of 2 CPU cores (the rest of the 20-minute budget is reading, evaluating and
indexing). full: for a GPU and big corpora: longer ICT with mined negatives through the gradient cache, then
SimCSE as a last stage. TSDAE is not in it: as a stage on all-MiniLM-L6-v2 (the paper's settings, one epoch)
it lowered every held-out score, drug reviews' real queries from 0.296 to 0.066 (docs/adapt.md, TSDAE).
Continued MLM (a base with an MLM head, or --mlm) runs before them for an epoch of the corpus (quick,
at most MLM_STEPS["quick"] steps) or several (full): epochs of the instances its prepared corpus gives.
The numbers behind these choices are in scripts/results/ and the README.
"""
from __future__ import annotations

from dataclasses import replace

from .methods import MethodSettings
from .mlm import MlmSettings

PRESETS = ("quick", "full")
QUICK_PASSAGES = 3_400  # training passages seen in quick: two epochs of ~150k words of prose
QUICK_MAX_EPOCHS = 3.0  # a small corpus gets more passes, within the same budget
DISTILLATION = 1.0  # KL weight to the starting model's in-batch rankings: drug-review --eval stayed at the
                    # base's 0.296 (0.241 without) while dev ICT rose more (README, scripts/results/); with the
                    # passages' rankings among themselves kept too (distill_documents), the index's --eval went
                    # 0.296 -> 0.306 for 0.211 -> 0.198 on the ICT test queries (scripts/results/adapt_hybrid.md)
# Held-out ICT queries (dev + test). nDCG@10 of 150 queries has a standard error near 0.025, more than what
# separates the choices dev makes (two fusion weights, two checkpoints): on Emma, 150 dev queries picked
# weight 0.4 for the base where 0.7 did better on test. A query costs training one sentence of its passage.
DOCUMENTS = 0.5  # weight of the passages' rankings among themselves within the teacher term (below)
# quick trains without dropout on the attention probabilities: on a CPU, torch's fused attention kernel has no
# dropout, so with it SDPA falls back to the math path and keeps (batch, heads, seq, seq) probabilities for the
# backward pass. all-MiniLM-L6-v2, 32 x 224 tokens, 2 threads: a step 4.46 -> 3.40 s in fp32 and 3.07 -> 2.21 s in
# bf16, peak RSS 4.0 -> 2.4 GB. Held out (README's commands, same queries): drug reviews' ICT stage 438 -> 360 s,
# index ICT test 0.199 -> 0.210, --eval 0.302 -> 0.307; Emma's 0.129 -> 0.128 (noise: +-0.02), its stage no faster
# on a busy host (428 s then, 461 s now). full (a GPU, whose kernels drop out) keeps it.
QUICK_ATTENTION_DROPOUT = 0.0
QUERIES = {"quick": 1_000, "full": 2_000}
HELD_OUT_SHARE = 0.5  # at most this share of the passages gives a query
# Passages the held-out queries are ranked against. Every evaluation (the base, each one during training, each
# stage's final scoring) embeds them all: on 2 CPU threads ~1,500 passages of ~150 words take ~40 s, so quick
# scores a bigger corpus against its queries' own passages and a sample of the others (a 150k-word corpus,
# ~1,500-1,800 passages, is scored whole); the index holds every passage either way.
SCORED_PASSAGES = {"quick": 2_000, "full": 50_000}
MLM_EPOCHS = {"quick": 1.0, "full": 5.0}  # passes over the prepared corpus's instances (mlm.sized_settings)
MLM_STEPS = {"quick": 150, "full": 20_000}  # at most; quick: Emma (157k words, 1,828 passages) is 77 an epoch
MLM_MIN_STEPS = 10  # a tiny corpus still gets a measurable change


def stage_settings(preset: str, training_passages: int, seed: int = 0) -> list[tuple[str, MethodSettings]]:
    """[(stage name, settings)] in the order they run, each starting from the one before."""
    if preset not in PRESETS:
        raise ValueError(f"preset {preset!r} is not one of {', '.join(PRESETS)}")
    ict = MethodSettings(method="ict", seed=seed)
    if preset == "quick":
        epochs = min(QUICK_MAX_EPOCHS, max(0.5, QUICK_PASSAGES / max(1, training_passages)))
        return [("ict", replace(ict, epochs=round(epochs, 2), learning_rate=1e-4, hard_negatives=False,
                                distillation=DISTILLATION, distill_documents=DOCUMENTS,
                                attention_dropout=QUICK_ATTENTION_DROPOUT))]
    return [("ict", replace(ict, epochs=3.0, evaluations_per_epoch=2, batch_size=64, mini_batch_size=32,
                            distillation=DISTILLATION, distill_documents=DOCUMENTS)),
            ("ict+simcse", replace(ict, method="simcse", epochs=1.0, learning_rate=2e-5, batch_size=64,
                                   hard_negatives=False))]


def with_lexical_teacher(planned: list[tuple[str, MethodSettings]], base_dense_weight: float
                         ) -> list[tuple[str, MethodSettings]]:
    """The distilled ICT stages of `planned` with a hybrid teacher: its sentence-to-passage scores fused with BM25's
    at the share BM25 has in the base's engine (1 - the dense weight the dev queries picked for the base; 0 where
    BM25 did not help the base). The model then learns what the hybrid ranks well, not only what the encoder did.
    Python's FAQ (quick, share 0.3, the same held-out queries): the model alone ICT test 0.477 -> 0.500, real
    questions 0.731 -> 0.742; its index (fused again) 0.534 -> 0.527 and 0.758 -> 0.764 (docs/adapt.md)."""
    share = round(1.0 - base_dense_weight, 2)
    return [(name, replace(settings, distill_lexical=share) if settings.method == "ict" and settings.distillation
             else settings) for name, settings in planned]


def tsdae_stage(seed: int = 0, epochs: float = 1.0) -> tuple[str, MethodSettings]:
    """A TSDAE stage, to put before the stages it should start them from: the paper's and
    sentence-transformers' settings (lr 3e-5, batch 8, deletion 60%), over the corpus's sentences. In no preset:
    on a trained sentence encoder it measured worse than the encoder it started from (docs/adapt.md)."""
    return ("tsdae", MethodSettings(method="tsdae", epochs=epochs, batch_size=8, learning_rate=3e-5,
                                    hard_negatives=False, seed=seed))


def query_count(preset: str, passages: int) -> int:
    return min(QUERIES[preset], int(passages * HELD_OUT_SHARE))


def scored_passages(preset: str) -> int:
    """At most this many passages are ranked for the held-out queries (SCORED_PASSAGES)."""
    return SCORED_PASSAGES[preset]


def mlm_settings(preset: str, vocab: str = "base", seed: int = 0, vocab_size: int | None = None) -> MlmSettings:
    """The continued-MLM stage: MLM_EPOCHS of the instances its prepared corpus gives, within [MLM_MIN_STEPS,
    MLM_STEPS] (the steps themselves are counted when the stage has prepared its corpus, with the vocabulary it
    trains: mlm.sized_settings). vocab_size: the vocabulary --vocab new learns (None: MlmSettings' default)."""
    settings = MlmSettings(vocab=vocab, seed=seed, learning_rate=1e-4 if preset == "quick" else 5e-5,
                           epochs=MLM_EPOCHS[preset], min_steps=MLM_MIN_STEPS, max_steps=MLM_STEPS[preset])
    return settings if vocab_size is None else replace(settings, vocab_size=vocab_size)
