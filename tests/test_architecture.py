"""The shape docs/ARCHITECTURE.md draws holds in the code: imports go down the picture, functions stay short.

Read from the source with `ast` (nothing is imported), so an import inside a function counts as
much as one at the top of a file: a lazy import is how a circle between layers gets dodged.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import bertforge

PACKAGE = Path(bertforge.__file__).parent

# The rows of the picture, bottom first. A module may import from its own unit and from any unit
# on a lower row, never from a unit on its own row or above. The single-file modules at the top
# of bertforge/ are one unit, "plumbing": of bertforge they import only each other.
ROWS = (
    ("plumbing",),
    ("engine",),  # attention, unpadding, batching by tokens, precision, devices: knows no model class
    ("models", "tokenization"),
    ("train",),
    ("embeddings",),
    ("bertforge",),  # bertforge/__init__.py, the public API: re-exports of models, tokenization, embeddings
    ("tasks",),
    ("search", "readmission", "export"),
    ("serve", "adapt"),  # adapt/: a domain's encoder from its raw text (indexes with search/, trains with train/)
    ("cli",),
    ("__main__",),  # __main__.py: `python -m bertforge`, the command line again
)
PLUMBING = {"atomic", "errors", "input_files", "markup", "progress", "resources", "settings", "validation"}
ROW = {unit: number for number, row in enumerate(ROWS) for unit in row}

# Upward imports known today, each with the reason it stays for now: (importing file, imported module).
# Empty: serve/ imports only from rows below it. Add an entry only with the work that will remove it.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}

MAX_FUNCTION_LINES = 60
# Functions over MAX_FUNCTION_LINES today, in files other work is rewriting; (file, function): the reason.
# Empty: the serve/ rewrite removed the last two (serve's copied signature, api_router's closures).
LONG_FUNCTIONS_ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    file: str  # relative to bertforge/
    line: int
    module: str  # the absolute module imported from, e.g. bertforge.models.model


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    """The unit of the picture a bertforge module belongs to: its sub-package, or "plumbing"."""
    parts = module.split(".")
    if len(parts) == 1:
        return "bertforge"
    return "plumbing" if parts[1] in PLUMBING else parts[1]


def imports_of(path: Path) -> list[Import]:
    """Every import of a bertforge module anywhere in `path` (top level, functions, TYPE_CHECKING blocks)."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            modules = [base]
        else:
            continue
        file = str(path.relative_to(PACKAGE))
        found += [Import(file, node.lineno, module) for module in modules if module.split(".")[0] == "bertforge"]
    return found


def upward_imports() -> list[str]:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = unit_of(module_name(path))
        for found in imports_of(path):
            target = unit_of(found.module)
            if target == source or ROW[target] < ROW[source] or (found.file, found.module) in ALLOWED_UPWARD:
                continue
            problems.append(f"bertforge/{found.file}:{found.line} imports {found.module}: {target}/ (row "
                            f"{ROW[target]}) is not below {source}/ (row {ROW[source]}) in ROWS")
    return problems


def test_every_unit_of_the_package_has_a_row():
    units = {unit_of(module_name(path)) for path in PACKAGE.rglob("*.py")}
    assert units <= set(ROW), f"place {sorted(units - set(ROW))} in ROWS (and in docs/ARCHITECTURE.md)"


def test_imports_go_down_the_picture():
    assert upward_imports() == []


def test_the_allowed_upward_imports_still_exist():
    """An entry of ALLOWED_UPWARD that no longer happens goes, so the list only ever shrinks."""
    happening = {(found.file, found.module) for path in PACKAGE.rglob("*.py") for found in imports_of(path)}
    assert set(ALLOWED_UPWARD) <= happening


def test_an_upward_import_is_named_by_file_line_and_rows(tmp_path, monkeypatch):
    """The check itself: a lazy import of the CLI from inside models/ is caught and located."""
    fake = tmp_path / "bertforge"
    (fake / "models").mkdir(parents=True)
    (fake / "__init__.py").write_text("from .models.model import BertModel\n__version__ = '0'\n")
    (fake / "models" / "__init__.py").write_text("")
    (fake / "models" / "model.py").write_text(
        "import torch\n\ndef f():\n    from ..cli.parser import main\n")
    (fake / "cli").mkdir()
    (fake / "cli" / "parser.py").write_text("from ..models.model import f\n")
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    assert upward_imports() == [
        "bertforge/models/model.py:4 imports bertforge.cli.parser: cli/ (row 9) is not below models/ (row 2) in ROWS"]


def long_functions(package: Path = PACKAGE) -> dict[tuple[str, str], int]:
    """{(file, function): lines from `def` to its last line} for each function over MAX_FUNCTION_LINES."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found[(str(path.relative_to(package)), node.name)] = lines
    return found


def test_no_function_is_over_sixty_lines():
    found = long_functions()
    assert {key: lines for key, lines in found.items() if key not in LONG_FUNCTIONS_ALLOWED} == {}
