"""adapt's report: every stage beside BM25 and the base model, as JSON, a markdown table and a bar chart.

Rows ("systems") are BM25, the base model zero-shot and each stage; columns are the
evaluation sets (held-out ICT dev and test, and the --eval BEIR folder) and their metrics.

`build_report` gathers what a run measured into the report's dict; `final_note` and `skipped_methods` are its
sentences.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from ..atomic import replaced_file, write_text
from ..tasks.retrieval.baselines import BM25_ANALYZER
from .evaluation import METRICS
from .mlm import MLM_OFF
from .vocabulary import fragmentation_table

if TYPE_CHECKING:  # the pipeline builds its report here
    from .pipeline import Run


def engine(system: dict) -> dict:
    """{"dense_weight", "sentence_weight", "neighbour_weight", "metrics"}: what an index built with this system ranks
    by (BM25 has none of its own): the model, its passages' best sentences mixed in at sentence_weight (0: none; a
    record made before them has none), fused with BM25 at dense_weight (1: none), each passage's best neighbour's
    score mixed in at neighbour_weight (0: none)."""
    chosen = system.get("hybrid") or {"dense_weight": 1.0, "metrics": system["metrics"]}
    return {"sentence_weight": 0.0, "neighbour_weight": 0.0, **chosen}


def settings_of(chosen: dict) -> tuple[float, float, float]:
    """(sentence weight, dense weight, neighbour weight) of an engine record (the missing ones 0, 0)."""
    return chosen.get("sentence_weight", 0.0), chosen["dense_weight"], chosen.get("neighbour_weight", 0.0)


def model_alone(chosen: dict) -> bool:
    """Whether an engine record ranks by the model's passage cosines alone: no sentences, BM25 or neighbours."""
    return settings_of(chosen) == (0.0, 1.0, 0.0)


def passage_engine(system: dict) -> dict:
    """{"dense_weight", "metrics"}: the model's passage vectors alone fused with BM25 at the weight its dev queries
    pick, what the distillation teacher's BM25 share is read from (a record made before sentences: its engine)."""
    return system.get("passage_hybrid") or engine(system)


def engine_name(system: dict, chosen: dict | None = None) -> str:
    """How a system's engine is named in the report: "ict + sentences (0.5) + BM25 (0.7) + neighbours (0.3)";
    chosen: which of its engines (default `engine(system)`)."""
    sentence, dense, neighbour = settings_of(engine(system) if chosen is None else chosen)
    name = system["name"] + (f" + sentences ({sentence:g})" if sentence > 0 else "")
    name += f" + BM25 ({dense:g})" if dense < 1 else ""
    return name + (f" + neighbours ({neighbour:g})" if neighbour > 0 else "")


def report_rows(systems: list[dict]) -> list[dict]:
    """Each system's row, followed by its fusion with BM25 when the dev queries picked a weight below 1, and by
    the engine with its best sentences mixed in when they picked that (what each adds, row by row)."""
    rows = []
    for system in systems:
        rows.append(system)
        for chosen in unique_engines(system):
            sentence, dense, neighbour = settings_of(chosen)
            rows.append({"name": engine_name(system, chosen), "metrics": chosen["metrics"], "dense_weight": dense,
                         "sentence_weight": sentence, "neighbour_weight": neighbour})
    return rows


def unique_engines(system: dict) -> list[dict]:
    """The system's engines other than the model alone: fused with BM25 (passage vectors), then with its best
    sentences mixed in, each once (a record made before sentences has one; a pick of no sentences is the first)."""
    engines = []
    for chosen in (passage_engine(system), engine(system)):
        if not model_alone(chosen) and all(settings_of(e) != settings_of(chosen) for e in engines):
            engines.append(chosen)
    return engines


def metrics_table(systems: list[dict], final: str) -> str:
    """Markdown: one row per system (name, then metrics per evaluation set), the final one marked."""
    sets = [name for name in ("dev", "test", "beir") if any(name in s["metrics"] for s in systems)]
    header = ["system", *[f"{label(name)} {metric}" for name in sets for metric in METRICS], "time"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for system in systems:
        cells = [system["name"] + (" (final)" if system["name"] == final else "")]
        for name in sets:
            values = system["metrics"].get(name, {})
            cells += [f"{values[m]:.4f}" if m in values else "" for m in METRICS]
        cells.append(f"{system['seconds']:.0f} s" if system.get("seconds") is not None else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def label(evaluation_set: str) -> str:
    return {"dev": "ICT dev", "test": "ICT test", "beir": "--eval"}[evaluation_set]


def build_report(run: Run, systems: list[dict], final: dict, seconds: float, queries: dict | None = None) -> dict:
    corpus = run.corpus
    settings = final.get("settings") or {}
    sentence_weight, dense_weight, neighbour_weight = settings_of(engine(final))
    return {"base": run.options.base, "preset": run.options.preset, "final": final["name"],
            "final_engine": engine_name(final), "dense_weight": dense_weight,
            "sentence_weight": sentence_weight, "neighbour_weight": neighbour_weight,
            "note": final_note(systems, final, tune_command(run)), "pooling": run.pooling, "bm25": BM25_ANALYZER,
            "corpus": {"files": [str(f) for f in corpus.files], "passages": len(corpus.passages),
                       "words": corpus.words, "duplicates": corpus.duplicates, "split": corpus.split},
            "vocabulary": run.vocabulary.to_json(), "vocabulary_table": fragmentation_table(run.vocabulary),
            "queries": {split: len(q) for split, q in run.held_out.queries.items()},
            "scored_passages": len(run.held_out.scored_indices()),
            "max_seq_length": settings.get("max_length") or run.max_seq_length,
            "systems": systems, "seconds": round(seconds, 1), "generated_queries": queries,
            "skipped": skipped_methods(run, {s.get("settings", {}).get("method") for s in systems})}


def tune_command(run: Run) -> str | None:
    """The command that re-picks the index's weights on the --eval folder's judged queries (None without one)."""
    if not run.options.eval:
        return None
    return f"bertforge index weight {shlex.quote(str(run.output / 'index'))} --tune {shlex.quote(run.options.eval)}"


def final_note(systems: list[dict], final: dict, tune: str | None = None) -> str:
    """What was picked and how it compares on the test queries (and --eval): the engine the index serves,
    the model alone, the base alone and fused with BM25, and BM25. Where the --eval queries rank better with the
    model alone than with the index, a last sentence says so and gives `tune`, the command that re-picks the
    index's weights on them: the held-out sentences that picked them share their passage's words more than
    people's queries do (Debian's FAQ questions: the model alone 0.683, the index 0.661)."""
    base, bm25 = (next(s for s in systems if s["name"] == name) for name in ("base", "bm25"))
    chosen = engine(final)
    lines = ["No stage beat the base model on the held-out dev queries: DIR/model is the base model, unchanged."
             if final is base else f"Final model: stage {final['name']}."]
    lines.append(f"DIR/index ranks by {engine_name(final)} (weights picked on the dev queries)."
                 if not model_alone(chosen)
                 else "DIR/index ranks by it alone (neither BM25, sentences nor neighbours helped on the dev queries).")
    for split in ("test", "beir"):
        if split not in chosen["metrics"]:
            continue
        score = chosen["metrics"][split]["ndcg@10"]
        alone, base_alone = final["metrics"][split]["ndcg@10"], base["metrics"][split]["ndcg@10"]
        base_engines = "; ".join(f"the base as {engine_name(base, e)} {e['metrics'][split]['ndcg@10']:.4f}"
                                 for e in unique_engines(base))
        lines.append(f"{'Held-out test' if split == 'test' else '--eval'} nDCG@10: the index {score:.4f} = "
                     f"{score / max(base_alone, 1e-9):.2f}x the base model ({base_alone:.4f}); the model alone "
                     f"{alone:.4f} ({alone / max(base_alone, 1e-9):.2f}x); {base_engines}; "
                     f"BM25 {bm25['metrics'][split]['ndcg@10']:.4f}.")
    if "beir" in chosen["metrics"] and final["metrics"]["beir"]["ndcg@10"] > chosen["metrics"]["beir"]["ndcg@10"]:
        lines.append("The --eval queries rank better with the model alone than with the index, whose weights the "
                     "held-out sentences picked (they share their passage's words more than questions do)"
                     + (f"; to serve the weights these queries prefer: {tune} (they are then no longer held out)."
                        if tune else "."))
    return " ".join(lines)


def skipped_methods(run: Run, methods: set[str]) -> list[str]:
    """What the issue's recipe names that this run did not do, and why."""
    if run.mlm_source is not None:
        mlm = []
    elif run.options.mlm == MLM_OFF:
        mlm = ["continued MLM: switched off (--mlm off)"]
    else:
        mlm = [f"continued MLM: the base ({run.architecture}) has no MLM head; --mlm CHECKPOINT names one to "
               "start from"]
    tsdae = [] if "tsdae" in methods else ["TSDAE: in no preset (as a stage on a trained sentence encoder it "
                                           "lowered every held-out score; docs/adapt.md)"]
    gpl = [] if run.options.query_generator else [
        "GPL pseudo-queries: no query generator given (--query-generator: a doc2query T5 folder or hub name, e.g. "
        "doc2query/msmarco-t5-base-v1)"]
    return [*mlm, *tsdae, *gpl]


def write_report(output: Path, report: dict) -> None:
    """DIR/report.json, report.md and report.png (nDCG@10 per system, one bar group per evaluation set)."""
    write_text(output / "report.json", json.dumps(report, indent=2) + "\n")
    write_text(output / "report.md", report_markdown(report))
    plot(output / "report.png", report_rows(report["systems"]))


def ranked_against(report: dict) -> str:
    """', ranked against N of the passages' when the queries were scored against a sample of a big corpus."""
    scored = report.get("scored_passages")
    return "" if scored in (None, report["corpus"]["passages"]) else f", ranked against {scored:,} of the passages"


def report_markdown(report: dict) -> str:
    corpus = report["corpus"]
    lines = [f"# adapt: {report['base']} on {corpus['passages']:,} passages ({corpus['words']:,} words)", "",
             f"Preset {report['preset']}; held-out ICT queries: {report['queries']['dev']} dev (pick the final "
             f"model), {report['queries']['test']} test (reported){ranked_against(report)}. Final model: "
             f"**{report['final']}**; "
             f"the index ranks with **{report['final_engine']}**.", ""]
    if report.get("note"):
        lines += [report["note"], ""]
    if report.get("generated_queries"):
        queries = report["generated_queries"]
        lines += [f"Generated queries: {queries['queries']:,} for {queries['passages']:,} of the {queries['of']:,} "
                  f"training passages, by {queries['generator']} ({queries['seconds']:.0f} s).", ""]
    lines += [metrics_table(report_rows(report["systems"]), report["final_engine"]), "", "## Vocabulary", "",
              report["vocabulary_table"], ""]
    if report.get("skipped"):
        lines += ["## Not run", ""] + [f"- {reason}" for reason in report["skipped"]] + [""]
    return "\n".join(lines)


def plot(path: Path, systems: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = [name for name in ("dev", "test", "beir") if any(name in s["metrics"] for s in systems)]
    figure, axes = plt.subplots(figsize=(1.6 + 1.2 * len(systems) * len(sets) / 2, 3.6))
    width = 0.8 / max(1, len(sets))
    for offset, name in enumerate(sets):
        values = [s["metrics"].get(name, {}).get("ndcg@10", 0.0) for s in systems]
        positions = [i + (offset - (len(sets) - 1) / 2) * width for i in range(len(systems))]
        axes.bar(positions, values, width, label=label(name))
    axes.set_xticks(range(len(systems)), [s["name"] for s in systems])
    axes.set_ylabel("nDCG@10")
    axes.legend()
    figure.tight_layout()
    with replaced_file(path) as temporary:
        figure.savefig(temporary, format="png", dpi=100)
    plt.close(figure)
