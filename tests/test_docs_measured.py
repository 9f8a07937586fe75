"""The docs' measurements, and the docs' links.

Every results page (docs/results/*.md) is measured as a whole, and so is every section of
README.md and the other docs whose heading says Measured (none today: measurements live on the
results pages): every table there says the command that made it and the date.
A table of numbers whose command or date is missing cannot be reproduced or dated, so the text
between a table and the one before it (or its heading) must name a command in backticks
(`attnserve ...`, `bash ...` or `python ...`) and a date (YYYY-MM-DD).

README.md is the guide a newcomer reads first: at most 250 lines, its test command the one
.ci/run runs, and every relative link in it and in docs/ leads to a file that exists (and to a
heading there, for #anchors into Markdown).
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMAND = re.compile(r"`(attnserve|bash|python3?) [^`]+`")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def measured_sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of every section whose heading says Measured, down to the next heading
    of the same or a higher level."""
    sections = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        heading = re.match(r"(#+) (.*)", line)
        if heading and "Measured" in heading.group(2):
            level = len(heading.group(1))
            end = next((j for j in range(i + 1, len(lines))
                        if re.match(rf"#{{1,{level}}} ", lines[j])), len(lines))
            sections.append((heading.group(2), "\n".join(lines[i + 1:end])))
    return sections


def tables_with_their_lead(body: str) -> list[tuple[str, str]]:
    """(first row, the text since the previous table or sub-heading) of each table."""
    found, lead, in_table = [], [], False
    for line in body.splitlines():
        if line.startswith("|"):
            if not in_table:
                found.append((line, "\n".join(lead)))
                lead, in_table = [], True
            continue
        if in_table or line.startswith("#"):
            lead = []
        in_table = False
        lead.append(line)
    return found


RESULTS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "results").glob("*.md"))
GUIDES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md") if "results" not in p.parts)]
DOCS = [*RESULTS, *(doc for doc in GUIDES if measured_sections((ROOT / doc).read_text()))]
README_MAX_LINES = 250


def sections_of(doc: str) -> list[tuple[str, str]]:
    """A results page is one measured section, from its title down; elsewhere the Measured sections."""
    text = (ROOT / doc).read_text()
    if doc.startswith("docs/results/"):
        return [(text.splitlines()[0].lstrip("# "), text)]
    return measured_sections(text)


def test_the_results_pages_are_there():
    assert len(RESULTS) >= 5, f"docs/results/ should hold the measurements: {RESULTS}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_measured_table_has_its_command_and_date(doc):
    sections = sections_of(doc)
    assert sections, f"{doc} has no Measured section"
    tables = [(heading, row, lead) for heading, body in sections for row, lead in tables_with_their_lead(body)]
    assert tables, f"{doc}'s Measured sections hold no table"
    missing = [f"{heading}: {row[:60]}" for heading, row, lead in tables
               if not (COMMAND.search(lead) and DATE.search(lead))]
    assert not missing, f"{doc}: tables without a command and a date just above them: {missing}"


def test_the_check_sees_a_table_without_its_command():
    body = "`attnserve bench x` (2026-12-01):\n\n| a |\n|---|\n\nThen another:\n\n| b |\n|---|\n"
    leads = [lead for _, lead in tables_with_their_lead(body)]
    assert len(leads) == 2 and COMMAND.search(leads[0]) and DATE.search(leads[0])
    assert not COMMAND.search(leads[1])


def test_the_readme_is_read_in_an_hour():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines, more than {README_MAX_LINES}: move detail into docs/"


def test_the_readme_gives_the_test_command_ci_runs():
    """.ci/run runs the README's test command verbatim: its last line is a copy of it."""
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip() and not line.startswith("#")][-1]
    commands = [line.strip() for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("    ")]
    assert ci.strip() in commands, f"README.md should give .ci/run's test command as it is: {ci}"


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor (the second of a name gets -1, the third -2, ...), outside code."""
    found, seen = set(), {}
    for line in without_code(text).splitlines():
        heading = re.match(r"#{1,6} (.*)", line)
        if heading:
            name = anchor(heading.group(1))
            found.add(f"{name}-{seen[name]}" if name in seen else name)
            seen[name] = seen.get(name, 0) + 1
    return found


def without_code(text: str) -> str:
    """The text with fenced blocks, indented code lines and inline code spans blanked out."""
    text = re.sub(r"(?ms)^```.*?^```", "", text)
    text = "\n".join("" if line.startswith("    ") and not line.lstrip().startswith(("-", "*")) else line
                     for line in text.splitlines())
    return re.sub(r"`[^`\n]*`", "", text)


def links(text: str) -> list[str]:
    """The targets of inline links and images, outside code."""
    return [m.group(1).split()[0] for m in re.finditer(r"\]\(([^)\s][^)]*)\)", without_code(text))]


LINKED = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]


def shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def broken_links(doc: Path) -> list[str]:
    broken = []
    for target in links(doc.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not a file here
            continue
        path, _, fragment = target.partition("#")
        where = (doc.parent / path).resolve() if path else doc
        if not where.exists():
            broken.append(f"{target} (no {shown(where)})")
        elif fragment and where.suffix == ".md" and fragment not in anchors(where.read_text()):
            broken.append(f"{target} (no such heading in {shown(where)})")
    return broken


@pytest.mark.parametrize("doc", LINKED)
def test_every_relative_link_leads_somewhere(doc):
    broken = broken_links(ROOT / doc)
    assert not broken, f"{doc}: links to nothing: {broken}"


def test_the_link_check_sees_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "there.md").write_text("# Quality on long documents\n\n## Every variant at 4,096 tokens\n\n## Notes\n\n## Notes\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[a](there.md#every-variant-at-4096-tokens) [b](there.md#notes-1) [c](https://example.org/x)\n"
                   "[d](missing.md) [e](there.md#no-such-heading) ![f](there.md) `[g](in-code.md)`\n\n"
                   "    [h](indented-code.md)\n")
    broken = [b.split()[0] for b in broken_links(doc)]
    assert broken == ["missing.md", "there.md#no-such-heading"]
