"""The README's adapt tables from DIR/report.json files.

    python scripts/adapt_results.py runs/adapt-emma/report.json runs/adapt-drugs/report.json
    python scripts/adapt_results.py --summary Emma=runs/adapt-emma/report.json "Drug reviews=runs/adapt-drugs/report.json"

One row per system of each report, each followed by its fusion with BM25 (the weight its dev queries
picked): nDCG@10 on the held-out ICT dev and test queries (and the --eval set when there is one), the
ratio to the base alone on test, recall@100, seconds, steps/s. The row the index ranks with is marked.

--summary: one row per corpus (NAME=REPORT), what each piece adds on the held-out ICT test queries (BM25, the base,
the base's best engine without training, the naive sentence-transformers fine-tune of scripts/adapt_naive_st.py
where scripts/results/adapt_naive_st.jsonl holds a run on the same queries, the trained model alone, the index),
and a second table for the corpora with --eval queries.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from bertforge.adapt.report import engine, report_rows

NAIVE_RESULTS = Path(__file__).parent / "results" / "adapt_naive_st.jsonl"


def rows(report: dict) -> list[str]:
    base = next(s for s in report["systems"] if s["name"] == "base")["metrics"]["test"]["ndcg@10"]
    lines = []
    for system in report_rows(report["systems"]):
        metrics = system["metrics"]
        beir = f"{metrics['beir']['ndcg@10']:.3f}" if "beir" in metrics else ""
        speed = f"{system['steps_per_second']:.3f}" if system.get("steps_per_second") else ""
        name = system["name"] + (" (the index)" if system["name"] == report.get("final_engine", report["final"])
                                 else "")
        lines.append(f"| {name} | {metrics['dev']['ndcg@10']:.3f} | {metrics['test']['ndcg@10']:.3f} | "
                     f"{metrics['test']['ndcg@10'] / base:.2f}x | {metrics['test']['recall@100']:.3f} | {beir} | "
                     f"{system.get('seconds') or 0:.0f} | {speed} |")
    return lines


def ndcg(metrics: dict, split: str) -> float:
    return metrics[split]["ndcg@10"]


def naive_run(naive_runs: list[dict], report: dict, base: dict) -> dict | None:
    """The last of `naive_runs` scored on the same held-out queries (its base row is the report's: `--report`)."""
    same = [run for run in naive_runs if run["words"] == report["corpus"]["words"]
            and all(abs(ndcg(run["base"], split) - ndcg(base, split)) < 1e-9 for split in ("dev", "test"))]
    return same[-1] if same else None


def summary_rows(name: str, report: dict, split: str, naive_runs: list[dict]) -> str:
    """One corpus's row on `split` (test: the held-out ICT queries, beside the naive run on them among `naive_runs`;
    beir: the --eval ones)."""
    systems = {system["name"]: system for system in report["systems"]}
    base, final = systems["base"], systems[report["final"]]
    base_score = ndcg(base["metrics"], split)
    naive = naive_run(naive_runs, report, base["metrics"]) if split == "test" else None
    cells = [ndcg(systems["bm25"]["metrics"], split), base_score, ndcg(engine(base)["metrics"], split)]
    naive_cell = " / ".join(f"{ndcg(naive[row], split):.3f} ({ndcg(naive[row], split) / base_score:.2f}x)"
                            for row in ("naive_st", "naive_st + bm25")) if naive else ""
    alone, index = ndcg(final["metrics"], split), ndcg(engine(final)["metrics"], split)
    corpus = report["corpus"]
    return (f"| {name} | {corpus['words']:,} | " + " | ".join(f"{cell:.3f}" for cell in cells)
            + (f" | {naive_cell}" if split == "test" else "")
            + f" | {alone:.3f} ({alone / base_score:.2f}x) | **{index:.3f}** | **{index / base_score:.2f}x** |")


def print_summary(named_reports: list[str]) -> None:
    reports = []
    for item in named_reports:
        name, _, path = item.rpartition("=")
        reports.append((name or path, read_report(path)))
    naive_runs = [json.loads(line) for line in NAIVE_RESULTS.read_text().splitlines()]
    print("| corpus | words | BM25 | base | the base's best engine, untrained | naive ST alone / fused "
          "| the model alone | the index | index / base |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, report in reports:
        print(summary_rows(name, report, "test", naive_runs))
    print("\n| corpus, real queries | words | BM25 | base | the base's best engine, untrained | the model alone "
          "| the index | index / base |")
    print("|---|---|---|---|---|---|---|---|")
    for name, report in reports:
        if "beir" in report["systems"][0]["metrics"]:
            print(summary_rows(name, report, "beir", naive_runs))


def read_report(path: str) -> dict:
    """DIR/report.json of `bertforge adapt`; SystemExit with one line for a missing, unreadable or other file."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SystemExit(f"{path}: not a readable report.json ({error}); give DIR/report.json of bertforge adapt")
    if not isinstance(report, dict) or not {"systems", "corpus", "final"} <= report.keys():
        raise SystemExit(f"{path}: not an adapt report (no systems, corpus or final); give DIR/report.json")
    return report


def main() -> None:
    if sys.argv[1:2] == ["--summary"]:
        print_summary(sys.argv[2:])
        return
    for path in sys.argv[1:]:
        report = read_report(path)
        corpus = report["corpus"]
        print(f"\n{path}: {corpus['passages']:,} passages, {corpus['words']:,} words, queries {report['queries']}, "
              f"total {report['seconds']:.0f} s\n")
        print("| system | ICT dev nDCG@10 | ICT test nDCG@10 | test / base | ICT test recall@100 | --eval nDCG@10 "
              "| seconds | steps/s |")
        print("|---|---|---|---|---|---|---|---|")
        print("\n".join(rows(report)))


if __name__ == "__main__":
    main()
