"""The README's Python examples run as written (in an empty folder, as on a user's fresh clone)."""
import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[1] / "README.md"


CLIENTS_SECTION = "### Use it from the clients you have"  # needs a live server: tests/test_serve_clients.py runs it


def python_blocks() -> list[str]:
    text = README.read_text(encoding="utf-8")
    start = text.index(CLIENTS_SECTION)
    end = text.find("\n## ", start)
    text = text[:start] + (text[end:] if end != -1 else "")
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_switch_with_an_import_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks()
    assert blocks, "the README lost its Python example"
    names: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), names)
    out, vectors = names["out"], names["vectors"]
    assert out.last_hidden_state.shape[:2] == names["batch"]["input_ids"].shape and len(out.hidden_states) == 7
    assert isinstance(vectors, np.ndarray) and vectors.shape == (2, 384)
    last_four = np.stack([h.detach().numpy() for h in out.hidden_states[-4:]]).mean(0)
    mask = names["batch"]["attention_mask"].numpy()[..., None]
    np.testing.assert_allclose(vectors, (last_four * mask).sum(1) / mask.sum(1), atol=1e-5)
