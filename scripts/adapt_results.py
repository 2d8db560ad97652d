"""The README's adapt table from DIR/report.json files (and, optionally, the naive ST runs' results).

    python scripts/adapt_results.py runs/adapt-emma/report.json runs/adapt-drugs/report.json

One row per system of each report, each followed by its fusion with BM25 (the weight its dev queries
picked): nDCG@10 on the held-out ICT dev and test queries (and the --eval set when there is one), the
ratio to the base alone on test, recall@100, seconds, steps/s. The row the index ranks with is marked.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from bertforge.adapt.report import report_rows


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


def main() -> None:
    for path in sys.argv[1:]:
        report = json.loads(Path(path).read_text())
        corpus = report["corpus"]
        print(f"\n{path}: {corpus['passages']:,} passages, {corpus['words']:,} words, queries {report['queries']}, "
              f"total {report['seconds']:.0f} s\n")
        print("| system | ICT dev nDCG@10 | ICT test nDCG@10 | test / base | ICT test recall@100 | --eval nDCG@10 "
              "| seconds | steps/s |")
        print("|---|---|---|---|---|---|---|---|")
        print("\n".join(rows(report)))


if __name__ == "__main__":
    main()
