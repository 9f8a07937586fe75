"""Long-document training sets from Debian documentation packages, in the dev set's format.

Run on Debian (apt-get and dpkg):

    python -m research.training_docs --out /tmp/trainsets/docs.jsonl.gz
    python -m research.training_docs --packages postgresql-doc-15,rust-doc --limit 200 --out FILE.jsonl
    python -m research.training_docs --deb ./some-doc_1.0_all.deb --out FILE.jsonl

Each package is fetched with `apt-get download` (Debian's own registry; nothing else is ever
fetched) into --cache, unpacked with `dpkg -x`, and its HTML pages (and titled plain-text,
reStructuredText and Markdown pages that have no rendered HTML beside them) become documents:
one JSON object a line, the fields of data/longdocs-*.jsonl.gz (src/attnserve/data/__init__.py):

    id                  PACKAGE/PATH, the page's path inside the package's documentation folder
    text                the page as text, one line per block, without its title
    query               the page's title (its first heading, else <title>)
    needle              30 consecutive words of text: text.split()[o:o + 30]
    needle_word_offset  o, drawn in [601, words - 30] by a generator seeded with the id

Pages under --min-words (1,500: the kernel set's rule) are skipped, and so is whatever the
dev set holds out: man pages of every section, as files (any path with /man/) or rendered as
HTML (DocBook refentry pages, asciidoc `manpage` pages, Sphinx NAME.7.html pages), and
Python's own documentation (any path or package with "python"). As a last guard, a page
sharing text with a --held-out document (default: the dev set) is dropped, and so is a page
that repeats one already kept (identical text, or most of it, e.g. a book's one-page edition).

The default packages are Debian 12 (bookworm, main) documentation packages whose manuals are
not the dev set's man pages: about 750 pages in all. Left out on purpose: openjdk-17-doc (960
generated Java API pages, which would outweigh every manual), cmake-doc (its manual *is* the
cmake-*.7 man pages of the dev set), git-doc (mostly man pages, several in the dev set),
bash-doc (its reference manual repeats bash-builtins(7)), zsh-doc (its manual is the zsh*(1)
man pages), linux-doc-6.1 (the bundled training set comes from it already), perl-doc,
glibc-doc and tcl8.6-doc (man pages); packages of info manuals only (autoconf-doc,
guile-3.0-doc) give nothing. gcc-12-doc, emacs-common-non-dfsg, gawk-doc and make-doc (GFDL
manuals) are in non-free, which the default apt sources (main) do not list. Any of these can
still be named with --packages (the filters above apply); manpages* and python packages cannot.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import zlib
from collections import Counter
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from tqdm import tqdm

from attnserve.data import DEV_DOCUMENTS

DEFAULT_PACKAGES = (  # and about how many pages of 1,500 words or more each gives (bookworm)
    "postgresql-doc-15",    # 150: the PostgreSQL manual (its SQL reference pages are man pages: skipped)
    "rust-doc",             # 150: the Rust book, reference, nomicon, std/core API pages
    "sqlite3-doc",          # 90: SQLite's documentation
    "apache2-doc",          # 70: the Apache HTTP Server manual (English pages only)
    "nodejs-doc",           # 50: the Node.js API
    "debian-reference-en",  # 13: the Debian Reference
    "developers-reference", # 6: the Debian Developer's Reference
    "debian-handbook",      # 27: the Debian Administrator's Handbook (English pages only)
    "vim-doc",              # 105: Vim's help files
    "octave-doc",           # 50: the GNU Octave manual
    "postfix-doc",          # 29: Postfix's READMEs
    "gettext-doc",          # 17: the GNU gettext manual
)
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "attnserve" / "debian-docs"
MIN_WORDS = 1500
NEEDLE_WORDS = 30
NEEDLE_FROM = 601  # the needle starts past word 600

HTML_SUFFIXES = (".html", ".htm", ".xhtml")
TEXT_SUFFIXES = (".txt", ".rst", ".md")
# Folders that hold no prose of their own: Sphinx's copies of its sources and assets, rustdoc's
# source listings, man pages, packaging metadata.
SKIP_DIRS = {"_sources", "_static", "_images", "src", "man", "doc-base", "lintian", "applications"}
# Whole-book or whole-API pages that repeat the chapters beside them, and index pages.
SKIP_NAMES = {"print.html", "all.html", "genindex.html", "bookindex.html", "search.html", "py-modindex.html"}
MAN_PAGE_NAME = re.compile(r"\.[1-9][a-z]*\.html?$")  # Sphinx man pages: cmake-commands.7.html
# What the dev set holds out, by package name.
HELD_OUT_PACKAGE = re.compile(r"^manpages|-man$|-manpages$|python")

# Elements whose content is navigation, search or decoration, not the page's text: by tag,
# then by class or id token (DocBook, Sphinx, rustdoc, mdBook, Doxygen, the Apache and
# Node.js manuals).
SKIP_TAGS = {"script", "style", "noscript", "template", "head", "nav", "header", "footer", "svg",
             "button", "form", "select", "textarea", "iframe", "object", "math"}
SKIP_CLASSES = {"navheader", "navfooter", "navigation", "sphinxsidebar", "sphinxsidebarwrapper", "related",
                "footer", "sidebar", "sidebar-elems", "breadcrumbs", "breadcrumb", "headerlink", "toc",
                "contents", "search-form", "search-container", "out-of-band", "srclink", "anchor",
                "menu-bar", "nav-wrapper", "nav-wide-wrapper", "mobile-nav-chapters", "nav-chapters",
                "toplang", "bottomlang", "menu", "mark", "picker", "navbar", "topic", "tagline", "searchmenu",
                "fancy_toc", "docnav", "hideme", "rightside", "since", "test-arrow"}
TITLE_CLASSES = {"fancy_title"}  # SQLite's page titles are a div, ahead of its numbered h1 sections
SKIP_IDS = {"toc", "gtoc", "column2", "page-header", "path", "footer", "sidebar", "menu-bar", "searchbox",
            "search-form", "navbar", "top", "side-bar", "banner",
            # rustdoc's trait impls repeat the trait's own docs (Iterator's 70 methods) on every type
            "trait-implementations-list", "synthetic-implementations-list", "blanket-implementations-list"}
BLOCK_TAGS = {"p", "div", "br", "li", "ul", "ol", "dl", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6",
              "tr", "table", "thead", "tbody", "pre", "blockquote", "section", "article", "main", "hr",
              "figure", "figcaption", "caption", "body", "html", "details", "summary", "center", "address"}
HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}
VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
             "source", "track", "wbr"}
# Common English words: a page with almost none of them is not in English (the model and the
# dev set are English; several manuals ship translations beside the English pages).
ENGLISH = {"the", "and", "of", "that", "with", "this", "which", "are", "from", "these", "when", "was", "is", "should", "would"}
MIN_ENGLISH_SHARE = 0.05  # English prose: 0.09 to 0.2; translations and impl-list-only API pages: below
LOCALE_DIR = re.compile(r"^[a-z]{2}[-_][a-z]{2}$", re.IGNORECASE)  # fr-FR, pt_BR, zh-cn: translations

# Near-duplicate test: sampled 8-word shingles (a quarter of them, chosen by a fixed hash).
SHINGLE_WORDS = 8
SHINGLE_SAMPLE = 4
HELD_OUT_SHARE = 0.05  # sharing a twentieth of the smaller document's shingles with a held-out one: dropped
DUPLICATE_SHARE = 0.5  # sharing half with a page already kept: dropped


class UserError(Exception):
    """Something the command line can fix; main() prints it and exits 2."""


# ---------------------------------------------------------------------------------------------
# Pages to text.


class _HTMLText(HTMLParser):
    """Text, title and kind of one HTML page.

    The standard library's parser: nothing in the project's environment converts HTML to text
    (no BeautifulSoup, lxml or html2text), and the documentation HTML here is generated and
    regular enough that block tags give lines and a few class names give the navigation.
    """

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self.line: list[str] = []
        self.title_tag: list[str] = []
        self.in_title = False
        self.heading: str | None = None  # the first heading, taken out of the text
        self.heading_open: str | None = None
        self.skip: tuple[str, int] | None = None  # (tag, nesting) of the skipped element we are in
        self.pre = 0
        self.lang = ""
        self.man_page = False

    # -- parser callbacks
    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = set((attrs.get("class") or "").split())
        if tag == "html":
            self.lang = (attrs.get("lang") or attrs.get("xml:lang") or "").lower()
        if ("refentry" in classes or "refnamediv" in classes) or (tag == "body" and "manpage" in classes):
            self.man_page = True  # a man page rendered as HTML (DocBook refentry, asciidoc manpage)
        if tag == "title" and (self.skip is None or self.skip[0] == "head"):
            self.in_title = True
            return
        if tag == "body" and self.skip is not None and self.skip[0] == "head":
            self.skip = None  # an unclosed <head>
        if self.skip is not None:
            if tag == self.skip[0] and tag not in VOID_TAGS:
                self.skip = (tag, self.skip[1] + 1)
            return
        if tag in SKIP_TAGS or classes & SKIP_CLASSES or (attrs.get("id") or "") in SKIP_IDS:
            if tag not in VOID_TAGS:
                self.skip = (tag, 1)
            return
        if tag in BLOCK_TAGS:
            self._flush()
        if tag == "pre":
            self.pre += 1
        if (tag in HEADINGS or classes & TITLE_CLASSES) and self.heading is None and self.heading_open is None:
            self.heading_open = tag
        if tag in ("td", "th"):
            self.line.append(" ")

    def handle_endtag(self, tag):
        if tag == "title" and self.in_title:
            self.in_title = False
            return
        if self.skip is not None:
            if tag == self.skip[0]:
                self.skip = None if self.skip[1] == 1 else (tag, self.skip[1] - 1)
            return
        if tag == self.heading_open:
            self.heading_open = None
            text = _collapse("".join(self.line))
            self.line = []
            if text:
                self.heading = text  # the page's title: not repeated in its text
            return
        if tag == "pre":
            self.pre = max(0, self.pre - 1)
        if tag in BLOCK_TAGS:
            self._flush()

    def handle_data(self, data):
        if self.in_title:
            self.title_tag.append(data)
            return
        if self.skip is not None:
            return
        if self.pre and self.heading_open is None:
            parts = data.split("\n")
            for i, part in enumerate(parts):
                if i:
                    self._flush()
                self.line.append(part)
        else:
            self.line.append(data)

    def _flush(self):
        if self.heading_open is not None:  # a block inside the title heading: one title still
            self.line.append(" ")
            return
        text = _collapse("".join(self.line))
        self.line = []
        if text:
            self.lines.append(text)

    def result(self) -> tuple[str, list[str]]:
        self._flush()
        title = self.heading or _collapse("".join(self.title_tag))
        lines = self.lines
        if not self.heading and lines and _collapse(lines[0]) == title:
            lines = lines[1:]  # the <title> repeated as the first line
        return title, lines


def _collapse(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


_NUMBERING = re.compile(r"^(?:(?i:chapter|appendix|part|section)\s+(?:[0-9]+|[A-Z]|[IVXLC]+)[.:]?\s+"
                        r"|[0-9]+(?:\.[0-9]+)*\.?\s+|[A-Z](?:\.[0-9]+)*\.\s+|[IVXLC]+\.\s+)")


def clean_title(title: str) -> str:
    """A page title as a query: no section number ("25.3. ", "Chapter 7. "), no trailing
    permalink mark, no " - Rust" / " | Node.js ... Documentation" site suffix."""
    title = _collapse(title).rstrip("¶#§ ").strip()
    title = re.sub(r"\s+(?:[-|—]\s+(?:Rust|Node\.js.*|.*Documentation.*|.*Manual.*))$", "", title)
    stripped = _NUMBERING.sub("", title, count=1)
    return stripped if stripped else title


def html_page(raw: bytes) -> tuple[str, str, str]:
    """(title, text, reason) of an HTML page; reason is "" when it may be used, else why not."""
    parser = _HTMLText()
    parser.feed(raw.decode("utf-8", errors="replace"))
    parser.close()
    if parser.man_page:
        return "", "", "man page"
    if parser.lang and not parser.lang.startswith("en"):
        return "", "", "not English"
    title, lines = parser.result()
    return title, "\n".join(lines), ""


_UNDERLINE = re.compile(r"^([=\-~*^#+`'\".:_])\1{2,}$")


def text_page(raw: bytes, suffix: str) -> tuple[str, str, str]:
    """(title, text, reason) of a plain-text page: reStructuredText or asciidoc (a title
    underlined with =, -, ~ ...) or Markdown (a first "# title" line); untitled ones are not used."""
    lines = [line.rstrip() for line in raw.decode("utf-8", errors="replace").splitlines()]
    start = next((i for i, line in enumerate(lines) if line.strip()), None)
    if start is None:
        return "", "", "untitled"
    title, body = "", []
    first = lines[start].strip()
    if _UNDERLINE.match(first) and start + 2 < len(lines) and _UNDERLINE.match(lines[start + 2].strip()):
        title, body = lines[start + 1], lines[start + 3:]  # overlined and underlined
    elif start + 1 < len(lines) and _UNDERLINE.match(lines[start + 1].strip()):
        title, body = first, lines[start + 2:]
    elif suffix == ".md" and first.startswith("# "):
        title, body = first[2:], lines[start + 1:]
    if not title:
        return "", "", "untitled"
    if re.fullmatch(r"[A-Z][A-Z0-9 ,/-]+", title.strip()):
        return "", "", "man page"  # a man page's section (NAME, CONFIGURATION FILE) kept as an include file
    kept = (_collapse(line) for line in body if not _UNDERLINE.match(line.strip()))  # no section underlines
    text = "\n".join(line for line in kept if line)
    return title, text, ""


def is_english(words: list[str]) -> bool:
    sample = words[:3000]
    common = sum(1 for w in sample if w.lower() in ENGLISH)
    return common >= MIN_ENGLISH_SHARE * len(sample)


# ---------------------------------------------------------------------------------------------
# Documents in the dev set's format.


def needle_offset(doc_id: str, n_words: int) -> int:
    """Where the needle starts: in [601, n_words - 30], the same for the same id every run."""
    return random.Random(f"needle:{doc_id}").randint(NEEDLE_FROM, n_words - NEEDLE_WORDS)


def make_document(doc_id: str, title: str, text: str) -> dict:
    """The record for a page of at least NEEDLE_FROM + NEEDLE_WORDS words."""
    words = text.split()
    offset = needle_offset(doc_id, len(words))
    return {"id": doc_id, "text": text, "query": title,
            "needle": " ".join(words[offset:offset + NEEDLE_WORDS]), "needle_word_offset": offset}


def shingles(text: str) -> set[int]:
    """A fixed quarter of the text's 8-word shingles (lower-cased letters and digits only, so
    that man pages' line-broken and HTML's layouts of the same text meet)."""
    tokens = re.findall(r"[a-z0-9]+", text.lower())
    out = set()
    for i in range(len(tokens) - SHINGLE_WORDS + 1):
        h = zlib.crc32(" ".join(tokens[i:i + SHINGLE_WORDS]).encode())
        if h % SHINGLE_SAMPLE == 0:
            out.add(h)
    return out


@dataclass
class ShingleIndex:
    """Which documents hold each sampled shingle; answers how much of a text is already there."""

    owners: dict[int, list[int]] = field(default_factory=dict)
    sizes: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)

    def add(self, name: str, marks: set[int]) -> None:
        index = len(self.sizes)
        self.sizes.append(len(marks))
        self.names.append(name)
        for mark in marks:
            self.owners.setdefault(mark, []).append(index)

    def closest(self, marks: set[int]) -> tuple[float, str]:
        """(share, name): the largest share of the smaller document's shingles that one
        indexed document has in common with marks."""
        shared = Counter()
        for mark in marks:
            for index in self.owners.get(mark, ()):
                shared[index] += 1
        best, name = 0.0, ""
        for index, count in shared.items():
            share = count / max(1, min(len(marks), self.sizes[index]))
            if share > best:
                best, name = share, self.names[index]
        return best, name


def held_out_index(paths: list[Path]) -> ShingleIndex:
    from attnserve.data import read_jsonl

    index = ShingleIndex()
    for path in paths:
        if not path.is_file():
            raise UserError(f"--held-out {path}: no such file; pass the JSONL of documents to keep out of training")
        for row in read_jsonl(path):
            index.add(str(row.get("id", "")), shingles(row.get("text", "")))
    return index


# ---------------------------------------------------------------------------------------------
# Packages.


def need_tool(tool: str) -> None:
    if shutil.which(tool) is None:
        raise UserError(f"{tool} not found: this builder runs on Debian or Ubuntu (apt and dpkg); "
                        f"install {'apt' if tool.startswith('apt') else 'dpkg'} or run it there")


def refuse_held_out(name: str) -> None:
    if HELD_OUT_PACKAGE.search(name):
        raise UserError(f"{name}: man pages and Python's documentation are held out (the dev set is man pages); "
                        f"drop it from --packages / --deb")


def apt_filename(name: str) -> str:
    """The file name `apt-get download NAME` writes; UserError when apt does not know NAME."""
    need_tool("apt-cache")
    result = subprocess.run(["apt-cache", "show", "--no-all-versions", name], capture_output=True, text=True)
    first = result.stdout.split("\n\n")[0]  # the candidate's record
    fields = dict(re.findall(r"^(Package|Version|Architecture): (\S+)$", first, re.MULTILINE))
    if result.returncode != 0 or len(fields) != 3:
        raise UserError(f"unknown package {name!r}: apt has no candidate for it here (see `apt-cache policy {name}`); "
                        f"check the name, run `apt-get update`, enable the archive area it is in (contrib, non-free) "
                        f"in the apt sources, or pass a downloaded file with --deb")
    # NAME_VERSION_ARCH.deb, the epoch's colon escaped (the pool's file name has no epoch)
    return f"{fields['Package']}_{fields['Version'].replace(':', '%3a')}_{fields['Architecture']}.deb"


def download(name: str, cache: Path) -> Path:
    """The package's .deb in cache/debs, fetched with `apt-get download` unless already there."""
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    deb = debs / apt_filename(name)
    if not deb.is_file():
        result = subprocess.run(["apt-get", "download", name], cwd=debs, capture_output=True, text=True)
        if result.returncode != 0 or not deb.is_file():
            raise SystemExit(f"apt-get download {name} failed (exit {result.returncode}):\n{result.stderr.strip()}")
    return deb


def deb_package(deb: Path) -> str:
    need_tool("dpkg-deb")
    result = subprocess.run(["dpkg-deb", "--field", str(deb), "Package"], capture_output=True, text=True)
    if result.returncode != 0 or not result.stdout.strip():
        raise UserError(f"--deb {deb}: not a Debian package ({result.stderr.strip() or 'no Package field'}); "
                        f"pass a .deb file, e.g. one from `apt-get download NAME`")
    return result.stdout.strip()


def extract(deb: Path, into: Path) -> Path:
    """dpkg -x deb into (once: a .complete mark says it was done)."""
    mark = into / ".complete"
    if not mark.is_file():
        shutil.rmtree(into, ignore_errors=True)
        into.mkdir(parents=True)
        result = subprocess.run(["dpkg", "-x", str(deb), str(into)], capture_output=True, text=True)
        if result.returncode != 0:
            raise UserError(f"--deb {deb}: dpkg -x failed: {result.stderr.strip()}")
        mark.touch()
    return into


def page_id(package: str, path: Path, root: Path) -> str:
    """PACKAGE/PATH, PATH relative to the package's documentation folder when it has one
    (usr/share/doc/NAME/ or usr/share/NAME/), else to the package root."""
    rel = path.relative_to(root).parts
    if rel[:3] == ("usr", "share", "doc") and len(rel) > 4:
        rel = rel[4:]
    elif rel[:2] == ("usr", "share") and len(rel) > 3:
        rel = rel[3:]
    return f"{package}/{'/'.join(rel)}"


def _suffix(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    return os.path.splitext(name)[1]


def candidates(root: Path) -> tuple[list[Path], Counter]:
    """The page files of an unpacked package and counts of what was passed over and why."""
    pages, passed = [], Counter()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(root)
        lowered = str(rel).lower()
        suffix = _suffix(path)
        if suffix not in HTML_SUFFIXES + TEXT_SUFFIXES:
            continue
        if "python" in lowered:
            passed["python"] += 1
            continue
        if "/man/" in f"/{lowered}" or lowered.startswith("usr/share/man/") or MAN_PAGE_NAME.search(path.name.lower()):
            passed["man page"] += 1
            continue
        if set(rel.parts[:-1]) & SKIP_DIRS or path.name.lower() in SKIP_NAMES or path.name.endswith(".rs.html"):
            passed["not a page"] += 1
            continue
        if any(LOCALE_DIR.match(part) and not part.lower().startswith("en") for part in rel.parts[:-1]):
            passed["not English"] += 1
            continue
        if suffix in TEXT_SUFFIXES:
            stem = path.name[: -len(".gz")] if path.name.endswith(".gz") else path.name
            stem = stem[: -len(suffix)]
            if any((path.parent / f"{stem}{ext}").exists() for ext in HTML_SUFFIXES):
                passed["source of an HTML page"] += 1
                continue
        pages.append(path)
    return pages, passed


def read_page(path: Path) -> tuple[str, str, str]:
    raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    suffix = _suffix(path)
    return html_page(raw) if suffix in HTML_SUFFIXES else text_page(raw, suffix)


@dataclass
class Builder:
    min_words: int = MIN_WORDS
    limit: int = 0
    seed: int = 0
    held_out: ShingleIndex = field(default_factory=ShingleIndex)
    kept: ShingleIndex = field(default_factory=ShingleIndex)
    digests: set = field(default_factory=set)
    ids: set = field(default_factory=set)

    def package(self, package: str, root: Path, write) -> tuple[int, Counter]:
        """Writes the documents of one unpacked package; (kept, skipped by reason)."""
        pages, skipped = candidates(root)
        # A seeded shuffle: --limit takes pages from all over the manual, the same ones each run.
        random.Random(f"{self.seed}:{package}").shuffle(pages)
        kept = 0
        bar = tqdm(pages, desc=package, unit="page", leave=False, file=sys.stderr)
        for read, path in enumerate(bar, 1):
            reason, record = self.page(package, path, root)
            if reason:
                skipped[reason] += 1
                continue
            write(record)
            kept += 1
            bar.set_postfix(kept=kept)
            if self.limit and kept >= self.limit:
                skipped["over --limit"] += len(pages) - read
                break
        bar.close()
        return kept, skipped

    def page(self, package: str, path: Path, root: Path) -> tuple[str, dict | None]:
        try:
            title, text, reason = read_page(path)
        except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
            return f"unreadable ({type(exc).__name__})", None
        if reason:
            return reason, None
        query = clean_title(title)
        if not query or len(query) > 200:
            return "untitled", None
        lines = text.split("\n")
        while lines and clean_title(lines[0]) == query:  # never the title again as the first line
            lines = lines[1:]
        text = "\n".join(lines)
        words = text.split()
        if len(words) < self.min_words:
            return "short", None
        if not is_english(words):
            return "not English prose", None
        digest = hashlib.sha256(" ".join(words).encode()).digest()
        if digest in self.digests:
            return "duplicate", None
        marks = shingles(text)
        if self.held_out.sizes and self.held_out.closest(marks)[0] >= HELD_OUT_SHARE:
            return "shares text with --held-out", None
        if self.kept.closest(marks)[0] >= DUPLICATE_SHARE:
            return "duplicate", None
        doc_id = page_id(package, path, root)
        if doc_id in self.ids:  # usr/share/doc/NAME/x.html and usr/share/NAME/x.html
            doc_id = f"{package}/{path.relative_to(root)}"
        self.ids.add(doc_id)
        self.digests.add(digest)
        self.kept.add(doc_id, marks)
        return "", make_document(doc_id, query, text)


def _summary(package: str, kept: int, skipped: Counter) -> str:
    skipped = skipped.copy()
    unread = skipped.pop("over --limit", 0)
    reasons = ", ".join(f"{reason} {count}" for reason, count in skipped.most_common())
    return (f"{package}: {kept} pages kept, {sum(skipped.values())} skipped" + (f" ({reasons})" if reasons else "")
            + (f", {unread} not read (--limit)" if unread else ""))


def build(args) -> int:
    out = Path(args.out)
    packages = [p.strip() for p in (args.packages or "").split(",") if p.strip()]
    if not packages and not args.deb:
        packages = list(DEFAULT_PACKAGES)
    debs = [Path(d) for d in args.deb]
    for deb in debs:
        if not deb.is_file():
            raise UserError(f"--deb {deb}: no such file; pass the path of a .deb (e.g. from `apt-get download NAME`)")
    for name in packages:
        refuse_held_out(name)
        apt_filename(name)  # every name is checked before anything is downloaded
    named = [(deb_package(deb), deb) for deb in debs]
    for name, _ in named:
        refuse_held_out(name)

    cache = Path(args.cache).expanduser()
    builder = Builder(min_words=args.min_words, limit=args.limit, seed=args.seed)
    held = [Path(p) for p in (args.held_out if args.held_out is not None else [str(DEV_DOCUMENTS)]) if p]
    if held:
        builder.held_out = held_out_index(held)

    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    opener = gzip.open if out.name.endswith(".gz") else open
    total, empty = 0, []
    with tempfile.TemporaryDirectory(prefix="training_docs-") as scratch, opener(partial, "wt", encoding="utf-8") as f:
        def write(record):
            f.write(json.dumps(record, ensure_ascii=False) + "\n")

        sources = [(name, None) for name in packages] + named
        for name, deb in sources:
            if deb is None:
                deb = download(name, cache)
                root = extract(deb, cache / "tree" / deb.stem)
            else:
                root = extract(deb, Path(scratch) / deb.stem)
            kept, skipped = builder.package(name, root, write)
            print(_summary(name, kept, skipped), flush=True)
            total += kept
            if not kept:
                empty.append(name)
    if not total:
        partial.unlink()
        raise UserError(f"no pages of at least {args.min_words} words in {', '.join(empty)}; "
                        f"name other documentation packages with --packages (or lower --min-words)")
    partial.replace(out)
    for name in empty:
        print(f"note: {name} gave no pages; it can be dropped from --packages", file=sys.stderr)
    print(f"wrote {total} documents to {out}")
    return 0


def configure(parser) -> None:
    parser.add_argument("--packages", help=f"comma-separated Debian documentation packages (default: {','.join(DEFAULT_PACKAGES)}; "
                                           f"none when only --deb is given)")
    parser.add_argument("--deb", action="append", default=[], metavar="PATH", help="a local .deb to use instead of downloading (repeatable)")
    parser.add_argument("--out", required=True, help="output JSONL; gzip-compressed when it ends in .gz")
    parser.add_argument("--cache", default=str(DEFAULT_CACHE), help=f"where downloaded and unpacked packages are kept (default {DEFAULT_CACHE})")
    parser.add_argument("--limit", type=int, default=0, help="at most N pages per package, a seeded sample (default: all)")
    parser.add_argument("--min-words", type=int, default=MIN_WORDS, help=f"shortest page kept, in words (default {MIN_WORDS})")
    parser.add_argument("--held-out", action="append", metavar="FILE",
                        help="JSONL whose documents' text must not reach training (repeatable; default: the dev set, "
                             "data/longdocs-dev.jsonl.gz; --held-out '' for none)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --limit sample (needles are seeded by id)")


def docs_command(args) -> int:
    """`python -m research.training_docs`: exit 2 with what to change on a user's error."""
    try:
        if args.limit < 0:
            raise UserError("--limit must be 0 (all pages) or more")
        if args.min_words < NEEDLE_FROM + NEEDLE_WORDS:
            raise UserError(f"--min-words must be at least {NEEDLE_FROM + NEEDLE_WORDS}: the needle is 30 words past word 600")
        return build(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m research.training_docs", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    configure(parser)
    return docs_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
