"""DIR/model's own files beyond the weights: the versions it was made with and a README model card."""
from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

from ..atomic import write_text
from .report import metrics_table

ST_CONFIG = "config_sentence_transformers.json"


def package_versions() -> dict[str, str]:
    """The versions sentence-transformers records (its own, transformers', pytorch's) plus bertforge's."""
    versions = {}
    for key, package in (("sentence_transformers", "sentence-transformers"), ("transformers", "transformers"),
                         ("pytorch", "torch"), ("bertforge", "bertforge")):
        try:
            versions[key] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return versions


def write_st_config(folder: Path) -> None:
    """config_sentence_transformers.json with the real versions and the similarity function (cosine)."""
    path = folder / ST_CONFIG
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    config.update({"__version__": package_versions(), "similarity_fn_name": "cosine"})
    config.setdefault("prompts", {})
    config.setdefault("default_prompt_name", None)
    write_text(path, json.dumps(config, indent=2) + "\n")


def write_card(folder: Path, report: dict) -> None:
    """README.md: what the model is, what it was adapted on and how, and how it scores."""
    corpus = report["corpus"]
    stages = [s for s in report["systems"] if s["name"] not in ("bm25", "base")]
    lines = ["---", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity",
             "tags: [sentence-transformers, feature-extraction, bertforge-adapt]", "---", "",
             f"# {report['base']} adapted to a domain corpus with `bertforge adapt`", "",
             f"- **Base model**: {report['base']}",
             f"- **Final stage**: {report['final']} (best nDCG@10 on the held-out dev queries)",
             f"- **Corpus**: {corpus['passages']:,} passages, {corpus['words']:,} words, from "
             f"{len(corpus['files'])} file(s); {corpus['duplicates']} exact duplicates dropped",
             f"- **Max sequence length**: {report['max_seq_length']} tokens; mean pooling; cosine similarity",
             "", "## Stages", ""]
    lines += [f"- `{s['name']}`: {s.get('description', '')}" for s in stages] or ["- none (the base model)"]
    lines += ["", "## Evaluation", "",
              f"Held-out ICT queries: a sentence cut from a passage that stays indexed without it; "
              f"{report['queries']['dev']} dev, {report['queries']['test']} test queries.", "",
              metrics_table(report["systems"], report["final"]), "", "## Use", "", "```python",
              "from sentence_transformers import SentenceTransformer", "",
              "model = SentenceTransformer(\"path/to/this/folder\")",
              "vectors = model.encode([\"a question about the domain\"])", "```", ""]
    write_text(folder / "README.md", "\n".join(lines))
