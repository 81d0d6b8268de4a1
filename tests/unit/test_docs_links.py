"""Every reference a reader can follow leads somewhere in this repository.

Scanned: README.md, docs/, src/, tests/, bench/ (markdown, Python, YAML, shell; not this
file, which spells out the patterns). Fails on
- a markdown link `[text](path)` or `[text](path#anchor)` to a file that does not exist,
  or to a heading that file does not have (anchors as GitHub makes them);
- "see X" where X names a file (`see config.py`, `see docs/router.md#reloading`) that is
  neither beside the referring file, under the repository root, nor under src/llmgw/;
- any citation of design notes that are not in the repository: "DESIGN", a bare "§2.7"
  section number, ENGINES.md, CONTROLLER_API.md, STYLE.md ("STYLE habit 5").
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("README.md", "docs", "src", "tests", "bench")
SUFFIXES = {".md", ".py", ".yaml", ".yml", ".sh", ".toml"}

LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
SEE = re.compile(r"\bsee\s+`?([\w./-]+\.(?:md|py|yaml|yml|sh|toml)(?:#[\w-]+)?)`?", re.IGNORECASE)
# Built from pieces so this file does not cite them itself.
_NOTES = ("DESIGN", "ENGINES" + r"\.md", "CONTROLLER_API", "STYLE" + r"\.md", "STYLE habit")
NOTES = re.compile(r"\b(?:" + "|".join(_NOTES) + r")\b|§\s*\d")
# In code, `x[i](y)` looks like a link: there only file-like targets count as links.
FILE_LIKE = re.compile(r"^[\w./-]+\.(?:md|py|yaml|yml|sh|toml|txt)(?:#[\w-]+)?$")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def scanned_files() -> list[Path]:
    out: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            out.append(path)
            continue
        for f in sorted(path.rglob("*")):
            parts = f.relative_to(ROOT).parts
            skipped = any(p == "__pycache__" or p.endswith(".egg-info") for p in parts)
            # This file spells out the patterns it looks for.
            if f.is_file() and f.suffix in SUFFIXES and not skipped and f != Path(__file__):
                out.append(f)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces → -."""
    text = re.sub(r"`|\*\*|__|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """Anchors of a markdown file's headings (outside code fences), with GitHub's -1, -2…"""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m is None:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def resolve(source: Path, target: str, *, search: bool) -> Path | None:
    """The file `target` names from `source`; with `search`, also from the root and src/llmgw."""
    bases = [source.parent]
    if search:
        bases += [ROOT, ROOT / "src" / "llmgw"]
    for base in bases:
        candidate = (base / target).resolve()
        if candidate.exists():
            return candidate
    return None


def problems(source: Path) -> list[str]:
    rel = source.relative_to(ROOT) if source.is_relative_to(ROOT) else source
    text = source.read_text(errors="replace")
    out: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{rel}:{number}"
        if NOTES.search(line):
            out.append(f"{where}: cites notes that are not in the repository: {line.strip()!r}")
        links = LINK.findall(line)
        if source.suffix != ".md":
            links = [t for t in links if FILE_LIKE.match(t)]
        found = [(m, False) for m in links]
        found += [(m, True) for m in SEE.findall(line)]
        for target, search in found:
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            page = source if not path else resolve(source, path, search=search)
            if page is None:
                out.append(f"{where}: {target!r}: no such file")
            elif anchor and page.suffix == ".md" and anchor not in anchors(page):
                out.append(f"{where}: {target!r}: {page.name} has no heading #{anchor}")
    return out


class TestDocsLinks:
    """References in the docs lead somewhere and every page is in the index."""

    @pytest.mark.parametrize("source", scanned_files(), ids=lambda p: str(p.relative_to(ROOT)))
    def test_references_lead_somewhere(self, source: Path) -> None:
        """Links, "see X" and section citations in this file point to what exists here."""
        assert problems(source) == []

    def test_the_checks_catch_what_they_should(self, tmp_path: Path) -> None:
        """A missing file, a missing anchor and a cited note are each reported; good ones pass."""
        (tmp_path / "other.md").write_text("# Other page\n\n## Some `code` here\n")
        page = tmp_path / "page.md"
        page.write_text(
            "# Title\n"
            "[ok](other.md#some-code-here) [ok](#title) [web](https://example.org/x.md)\n"
            "[gone](missing.md) [bad anchor](other.md#nowhere)\n"
            "see other.md, but see absent.py\n"
            "as the " + "DESIGN" + " notes say (§3.2)\n"
        )
        found = problems(page)
        assert len(found) == 4, found
        assert "'missing.md': no such file" in found[0]
        assert "other.md has no heading #nowhere" in found[1]
        assert "'absent.py': no such file" in found[2]
        assert "cites notes" in found[3]
        assert slug("`llmgw ctl` — the CLI") == "llmgw-ctl--the-cli"

    def test_every_docs_page_is_in_the_index(self) -> None:
        """docs/README.md links every page of docs/, so a new page cannot be orphaned."""
        index = (ROOT / "docs" / "README.md").read_text()
        linked = {t.partition("#")[0] for t in LINK.findall(index)}
        pages = {p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"}
        assert pages - linked == set()
