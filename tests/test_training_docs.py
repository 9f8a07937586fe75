"""research/training_docs.py (`python -m research.training_docs`): a documentation .deb becomes long documents in the dev set's
format, without man pages, short pages, Python's docs or held-out text. A tiny .deb built here
stands in for a Debian package (--deb), so nothing is downloaded."""
from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "attnserve-test-doc"

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb (Debian tools)")


def prose(name: str, sentences: int) -> str:
    """English-looking paragraphs in which every 8 consecutive words hold `name`, so that two
    pages made from different names share no text."""
    return "\n".join(
        f"<p>The {name} unit {i} is connected with the {name} module and this {name} parser.</p>"
        for i in range(sentences))


def page(title: str, heading: str, body: str, extra: str = "") -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><title>{title}</title><script>var x = 1;</script></head><body>'
            f'<div class="navheader">Prev Up Next Home</div>{extra}<h1>{heading}</h1>{body}'
            f'<div class="navfooter">Prev Up Next Home</div></body></html>')


def build_deb(tmp_path: Path, files: dict[str, str], name: str = PACKAGE) -> Path:
    tree = tmp_path / f"{name}-tree"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 1.0\nArchitecture: all\nMaintainer: Test <test@example.org>\n"
        f"Description: test documentation\n")
    for rel, content in files.items():
        path = tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    deb = tmp_path / f"{name}_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(tree), str(deb)], check=True, capture_output=True)
    return deb


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "research.training_docs", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("training_docs")
    html = f"usr/share/doc/{PACKAGE}/html"
    held_text = prose("gamma", 120)
    deb = build_deb(tmp, {
        f"{html}/alpha.html": page("Alpha Guide - Test Manual", "1.2. Alpha Guide", prose("alpha", 120)),
        f"{html}/beta.html": page("Beta", "Beta Reference", prose("beta", 140)),
        f"{html}/gamma.html": page("Gamma", "Gamma Notes", held_text),  # its text is in --held-out
        f"{html}/short.html": page("Short", "Short Page", prose("short", 10)),
        f"{html}/python-intro.html": page("Python", "Python Intro", prose("snake", 120)),
        f"{html}/sql-delta.html": page("DELTA", "DELTA", prose("delta", 120), extra='<div class="refentry">'),
        "usr/share/man/man7/epsilon.html": page("Epsilon", "Epsilon", prose("epsilon", 120)),
    })
    held = tmp / "held.jsonl"
    # The held-out copy is laid out differently (one line, other punctuation): still caught.
    held.write_text(json.dumps({"id": "gamma.7.gz", "text": held_text.replace("<p>", "").replace("</p>", " ;")}) + "\n")
    out = tmp / "out" / "docs.jsonl.gz"
    result = run("--deb", str(deb), "--out", str(out), "--cache", str(tmp / "cache"), "--held-out", str(held))
    assert result.returncode == 0, result.stderr
    with gzip.open(out, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return rows, result


def test_long_pages_become_documents_in_the_dev_sets_format(built):
    rows, _ = built
    by_id = {row["id"]: row for row in rows}
    assert sorted(by_id) == [f"{PACKAGE}/html/alpha.html", f"{PACKAGE}/html/beta.html"]
    for row in rows:
        assert set(row) == {"id", "text", "query", "needle", "needle_word_offset"}
        words = row["text"].split()
        offset = row["needle_word_offset"]
        assert len(words) >= 1500
        assert 600 < offset <= len(words) - 30
        assert row["needle"] == " ".join(words[offset:offset + 30])
        assert row["query"] not in row["text"].split("\n")[0]
        assert "Prev Up Next" not in row["text"] and "var x" not in row["text"]  # navigation and scripts dropped
    assert by_id[f"{PACKAGE}/html/alpha.html"]["query"] == "Alpha Guide"  # first heading, section number dropped
    assert by_id[f"{PACKAGE}/html/beta.html"]["query"] == "Beta Reference"
    assert by_id[f"{PACKAGE}/html/alpha.html"]["text"].startswith("The alpha unit 0 is connected with the alpha module")


def test_man_pages_short_pages_python_and_held_out_text_are_left_out(built):
    rows, result = built
    text = "\n".join(row["text"] for row in rows)
    for name in ("epsilon", "delta", "short", "snake", "gamma"):
        assert f"The {name} unit" not in text
    summary = result.stdout
    assert f"{PACKAGE}: 2 pages kept" in summary
    for reason in ("man page 2", "short 1", "python 1", "shares text with --held-out 1"):
        assert reason in summary, summary


def test_needles_are_the_same_every_run(built):
    from research.training_docs import make_document

    rows, _ = built
    for row in rows:
        assert make_document(row["id"], row["query"], row["text"]) == row


def test_what_a_user_can_get_wrong_exits_2_naming_the_fix(tmp_path):
    out = str(tmp_path / "out.jsonl")
    missing = run("--deb", str(tmp_path / "nope.deb"), "--out", out, "--held-out", "")
    assert missing.returncode == 2 and "no such file" in missing.stderr
    (tmp_path / "junk.deb").write_text("not a package")
    junk = run("--deb", str(tmp_path / "junk.deb"), "--out", out, "--held-out", "")
    assert junk.returncode == 2 and "not a Debian package" in junk.stderr
    held = run("--packages", "manpages-dev", "--out", out, "--held-out", "")
    assert held.returncode == 2 and "held out" in held.stderr
    if shutil.which("apt-cache"):
        unknown = run("--packages", "attnserve-no-such-doc-package", "--out", out, "--held-out", "")
        assert unknown.returncode == 2 and "unknown package" in unknown.stderr
    deb = build_deb(tmp_path, {f"usr/share/doc/{PACKAGE}/html/short.html": page("Short", "Short", prose("short", 10))})
    empty = run("--deb", str(deb), "--out", out, "--cache", str(tmp_path / "cache"), "--held-out", "")
    assert empty.returncode == 2 and "no pages of at least 1500 words" in empty.stderr
    assert not Path(out).exists()
