"""The parameter table of seed 002 ("the BERT model has 201 different named parameters"),
with totals per block so the 110M of BERT-base can be read off.
"""
from __future__ import annotations

import re

from torch import nn


def block_of(name: str) -> str:
    """Group a parameter name into its block: embeddings, layer N, pooler, or a head."""
    name = name.removeprefix("bert.")
    if layer := re.match(r"encoder\.layer\.(\d+)\.", name):
        return f"encoder layer {layer.group(1)}"
    return name.split(".")[0]


def parameter_table(model: nn.Module, show_layers: str = "first") -> str:
    """Rows of (name, shape) grouped by block, each block with its total, and a grand total.

    show_layers: "first" lists the weights of encoder layer 0 only (the others have the
    same shapes; their totals are still shown), "all" lists every weight.
    """
    blocks: dict[str, list[tuple[str, tuple[int, ...], int]]] = {}
    # Checkpoint names, as the tutorial lists them; tied weights once.
    for name, parameter in model.named_parameters():
        blocks.setdefault(block_of(name), []).append((name, tuple(parameter.shape), parameter.numel()))
    width = max(len(name) for rows in blocks.values() for name, _, _ in rows) + 2
    count = sum(len(rows) for rows in blocks.values())
    lines = [f"{type(model).__name__} has {count} named parameters\n"]
    for block, rows in blocks.items():
        total = sum(n for _, _, n in rows)
        lines.append(f"==== {block} ({total:,} parameters) ====")
        if show_layers == "all" or not block.startswith("encoder layer") or block == "encoder layer 0":
            lines += [f"{name:<{width}} {str(shape):>14}" for name, shape, _ in rows]
        lines.append("")
    grand_total = sum(n for rows in blocks.values() for _, _, n in rows)
    lines.append(f"total: {grand_total:,} parameters ({grand_total * 4 / 2**20:,.1f} MiB in fp32)")
    return "\n".join(lines)
