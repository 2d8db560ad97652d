"""Every relative link in the README and docs/ leads to a file of the repository (text moves between them)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(page: Path) -> list[str]:
    """The page's Markdown link targets that are paths: not a URL (scheme:) nor an anchor on the page itself."""
    return [target.split("#")[0] for target in LINK.findall(page.read_text(encoding="utf-8"))
            if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")]


def test_every_relative_link_of_the_readme_and_docs_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = [f"{page.relative_to(ROOT)} -> {target}" for page in pages for target in relative_links(page)
              if not (page.parent / target).exists()]
    assert len(pages) > 5 and not broken, broken


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[here](missing.md#part), [web](https://example.org), [up](#top), [ok](page.md)")
    assert relative_links(page) == ["missing.md", "page.md"]
