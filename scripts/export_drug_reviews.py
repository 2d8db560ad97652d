"""Drug reviews (data/drug-reviews/*.tsv, see scripts/fetch_data.py) -> clean JSONL: {"text", "label", "condition", "drug"}.

The TSVs wrap each review in triple quotes and keep HTML entities (&#039;); both are
artefacts of the export, not of the reviews, so they are undone here once.
Usage: python scripts/export_drug_reviews.py [DATA_DIR] [OUTPUT_DIR]
"""
import csv
import html
import json
import sys
from pathlib import Path


def clean_review(raw: str) -> str:
    text = html.unescape(raw).strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':  # csv leaves one pair of the triple quotes
        text = text[1:-1]
    return " ".join(text.split())


def export(data_dir: Path, output_dir: Path) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        with (data_dir / "drug-reviews" / f"{split}.tsv").open(encoding="utf-8", newline="") as source, \
                (output_dir / f"{split}.jsonl").open("w", encoding="utf-8") as target:
            for row in csv.DictReader(source, delimiter="\t"):
                record = {"text": clean_review(row["review"]), "label": row["rating"],
                          "condition": row["condition"], "drug": row["drugName"]}
                target.write(json.dumps(record, ensure_ascii=False) + "\n")
        print(f"wrote {output_dir / f'{split}.jsonl'}")


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    from bertforge.resources import demo_data

    try:  # a fresh clone without the demo data: the one line saying how to fetch it, not a traceback
        source = Path(sys.argv[1]) if len(sys.argv) > 1 else demo_data("drug-reviews").parent
    except ValueError as error:
        sys.exit(f"export_drug_reviews: {error}")
    export(source, Path(sys.argv[2]) if len(sys.argv) > 2 else root / "runs" / "drug-reviews")
