"""bm25s runs a JAX op as it is imported; JAX with CUDA then takes 75% of the GPU. require_bm25s keeps it on the CPU."""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("bm25s")

# A stand-in for JAX that records the platform it was started with, as bm25s' import would start the real one.
FAKE_JAX = {"jax/__init__.py": "import os\nPLATFORMS = os.environ.get('JAX_PLATFORMS')\nfrom . import lax\n",
            "jax/lax.py": "def top_k(values, k):\n    return values[:k], list(range(k))\n"}


def platform_jax_saw(tmp_path, environment: dict, before: str = "") -> str:
    for name, text in FAKE_JAX.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    probe = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        {before}
        from bertforge.tasks.retrieval.baselines import bm25_scores
        bm25_scores(["a cat on a mat"], ["the cat sat on the mat", "a dog in the fog"])
        import jax
        print(jax.PLATFORMS)
    """)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=environment,
                            check=True)
    return result.stdout.strip()


def base_environment(monkeypatch) -> dict:
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    return dict(os.environ)


def test_jax_imported_by_bm25s_starts_on_the_cpu(tmp_path, monkeypatch):
    assert platform_jax_saw(tmp_path, base_environment(monkeypatch)) == "cpu"


def test_a_platform_the_user_chose_is_kept(tmp_path, monkeypatch):
    environment = {**base_environment(monkeypatch), "JAX_PLATFORMS": "cuda"}
    assert platform_jax_saw(tmp_path, environment) == "cuda"


def test_jax_already_in_use_is_left_alone(tmp_path, monkeypatch):
    assert platform_jax_saw(tmp_path, base_environment(monkeypatch), before="import jax") == "None"
