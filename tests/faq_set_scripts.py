"""The scripts that write a FAQ as a BEIR set (scripts/*_faq_set.py): one imported as a module, one run on bad input."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
BAD_INPUT = ("missing deb", "not a deb", "output is a file", "output inside a file")


def loaded_script(name: str) -> ModuleType:
    """scripts/NAME.py as a module; the scripts folder is on sys.path while it loads (a set script imports
    python_faq_set beside it)."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while the script runs
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


def check_bad_input_is_one_line(name: str, tmp_path: Path, case: str, deb_options: tuple[str, ...] = ("--deb",)):
    """Run scripts/NAME.py on a `case` of BAD_INPUT (each of `deb_options` given the same .deb): exit 1 with one line
    of stderr, no traceback, and an --output that is a file left as it was."""
    deb, output = tmp_path / "package.deb", tmp_path / "out"
    if case == "not a deb":
        deb.write_text("not an archive")
    if case == "output is a file":
        output.write_text("keep me")
    if case == "output inside a file":
        output.write_text("keep me")
        output = output / "set"
    debs = [part for option in deb_options for part in (option, str(deb))]
    result = subprocess.run([sys.executable, str(SCRIPTS / f"{name}.py"), *debs, "--output", str(output)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    if case in ("output is a file", "output inside a file"):  # said before the .deb is looked at, the file kept
        assert result.stderr.startswith("--output") and (tmp_path / "out").read_text() == "keep me"
