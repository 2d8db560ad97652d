"""DIR/model's README model card (BiEncoder.save_pretrained writes the rest, versions included)."""
from __future__ import annotations

from pathlib import Path

from ..atomic import write_text
from .report import metrics_table, report_rows


def write_card(folder: Path, report: dict) -> None:
    """README.md: what the model is, what it was adapted on and how, and how it scores."""
    corpus = report["corpus"]
    stages = [s for s in report["systems"] if s["name"] not in ("bm25", "base")]
    lines = ["---", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity",
             "tags: [sentence-transformers, feature-extraction, bertforge-adapt]", "---", "",
             f"# {report['base']} adapted to a domain corpus with `bertforge adapt`", "",
             f"- **Base model**: {report['base']}",
             f"- **Final stage**: {report['final']} (best nDCG@10 on the held-out dev queries as its index ranks, "
             f"{report['final_engine']}; each stage's checkpoint was picked by the dev queries fused with BM25, "
             "hybrid_ndcg@10; the tables' plain rows are the model alone, `+ sentences (w)` mixes in each passage's "
             "best sentence at weight w, `+ BM25 (w)` fuses with BM25 at dense weight w, `+ neighbours (w)` mixes in "
             "each passage's best neighbour in its document at weight w)",
             f"- **Corpus**: {corpus['passages']:,} passages, {corpus['words']:,} words, from "
             f"{len(corpus['files'])} file(s); {corpus['duplicates']} exact duplicates dropped",
             f"- **Max sequence length**: {report['max_seq_length']} tokens; {report['pooling']} pooling; cosine "
             "similarity",
             "", "## Stages", ""]
    lines += [f"- `{s['name']}`: {s.get('description', '')}" for s in stages] or ["- none (the base model)"]
    lines += ["", "## Evaluation", "",
              f"Held-out ICT queries: a sentence cut from a passage that stays indexed without it; "
              f"{report['queries']['dev']} dev, {report['queries']['test']} test queries.", "",
              metrics_table(report_rows(report["systems"]), report["final_engine"]), "", "## Use", "", "```python",
              "from sentence_transformers import SentenceTransformer", "",
              "model = SentenceTransformer(\"path/to/this/folder\")",
              "vectors = model.encode([\"a question about the domain\"])", "```", ""]
    write_text(folder / "README.md", "\n".join(lines))
