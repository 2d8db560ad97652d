"""scripts/adapt_results.py --summary: the README's one adapt table, a row per corpus from its report.json."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "adapt_results.py"


@pytest.fixture(scope="module")
def results():
    spec = importlib.util.spec_from_file_location("adapt_results", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def scores(test: float, beir: float | None = None) -> dict:
    metrics = {"dev": {"ndcg@10": test - 0.01}, "test": {"ndcg@10": test}}
    return {**metrics, "beir": {"ndcg@10": beir}} if beir is not None else metrics


def report(beir: bool) -> dict:
    """A run whose base scores 0.4, its untrained engine 0.45, its ict stage 0.44 alone and 0.5 as the index."""
    real = (lambda value: value) if beir else (lambda value: None)
    return {"final": "ict", "corpus": {"words": 1234},
            "systems": [{"name": "bm25", "metrics": scores(0.3, real(0.35))},
                        {"name": "base", "metrics": scores(0.4, real(0.6)),
                         "hybrid": {"dense_weight": 0.8, "metrics": scores(0.45, real(0.62))}},
                        {"name": "ict", "metrics": scores(0.44, real(0.66)),
                         "hybrid": {"dense_weight": 0.7, "metrics": scores(0.5, real(0.64))}}]}


def test_a_row_reads_each_piece_and_the_naive_run_on_the_same_queries(results):
    naive = {"words": 1234, "base": scores(0.4), "naive_st": scores(0.42), "naive_st + bm25": scores(0.46)}
    other = {**naive, "base": scores(0.41), "naive_st": scores(0.9)}  # another draw of queries: not this run's
    assert results.summary_rows("Corpus", report(beir=True), "test", [naive, other]) == (
        "| Corpus | 1,234 | 0.300 | 0.400 | 0.450 | 0.420 (1.05x) / 0.460 (1.15x) | 0.440 (1.10x) | **0.500** | "
        "**1.25x** |")
    assert results.summary_rows("Corpus", report(beir=True), "beir", [naive, other]) == (
        "| Corpus | 1,234 | 0.350 | 0.600 | 0.620 | 0.660 (1.10x) | **0.640** | **1.07x** |")


def test_the_summary_prints_the_real_queries_of_the_runs_that_have_them(results, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(results, "NAIVE_RESULTS", tmp_path / "none.jsonl")
    (tmp_path / "none.jsonl").write_text("")
    for name, beir in (("with", True), ("without", False)):
        (tmp_path / f"{name}.json").write_text(json.dumps(report(beir)))
    results.print_summary([f"With eval={tmp_path / 'with.json'}", f"No eval={tmp_path / 'without.json'}"])
    ict_table, real_table = capsys.readouterr().out.split("\n\n")
    assert "| With eval |" in ict_table and "| No eval |" in ict_table and "| 0.440 (1.10x) |" in ict_table
    assert "| With eval |" in real_table and "No eval" not in real_table


@pytest.mark.parametrize("content", [None, "not json", "[1]", '{"systems": []}'])
def test_a_file_that_is_not_a_report_is_one_line(results, tmp_path, content):
    path = tmp_path / "report.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit, match="report.json") as stopped:
        results.read_report(str(path))
    assert "\n" not in str(stopped.value)
