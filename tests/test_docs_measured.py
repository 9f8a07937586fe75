"""The READMEs' measured sections: every table says the command that made it and the date.

A table of numbers whose command or date is missing cannot be reproduced or dated, so the text
between a table and the one before it (or its heading) must name a command in backticks
(`attnserve ...`, `bash ...` or `python ...`) and a date (YYYY-MM-DD).
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


DOCS = ["README.md", "src/attnserve/service/README.md"]


@pytest.mark.parametrize("doc", DOCS)
def test_every_measured_table_has_its_command_and_date(doc):
    sections = measured_sections((ROOT / doc).read_text())
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
