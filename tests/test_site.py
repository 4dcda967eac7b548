"""The built site reads as documentation: the site is built once (``mkdocs build --strict``, as
``make docs`` builds it) and its pages are read as a browser gets them, without the theme's
scripts: no literal ``\\|`` from an escaped table cell, every plot followed by its caption, no
placeholder text, and the API reference shows documentation, not source code."""

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import REPO


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)], cwd=REPO,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


class Page(HTMLParser):
    """A page's visible text outside code blocks, and its paragraphs in order (class, text, images)."""

    def __init__(self, html: str):
        super().__init__()
        self.text: list[str] = []
        self.paragraphs: list[dict] = []
        self._skip = 0  # inside <pre>, <script> or <style>
        self._paragraph: dict | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("pre", "script", "style"):
            self._skip += 1
        elif tag == "p":
            self._paragraph = {"class": attrs.get("class") or "", "text": "", "images": []}
            self.paragraphs.append(self._paragraph)
        elif tag == "img" and self._paragraph is not None:
            self._paragraph["images"].append(attrs.get("src", ""))

    def handle_endtag(self, tag):
        if tag in ("pre", "script", "style"):
            self._skip -= 1
        elif tag == "p":
            self._paragraph = None

    def handle_data(self, data):
        if self._skip:
            return
        self.text.append(data)
        if self._paragraph is not None:
            self._paragraph["text"] += data


def pages(site: Path) -> dict[str, Page]:
    return {str(p.relative_to(site)): Page(p.read_text()) for p in sorted(site.rglob("index.html"))
            if "assets" not in p.parts}


def test_no_page_shows_an_escaped_bar(site):
    """A ``|`` escaped inside a table cell (``str \\| None``) must render as a bar."""
    shown = {name: page for name, page in pages(site).items() if "\\|" in "".join(page.text)}
    assert not shown, sorted(shown)


def test_every_plot_has_a_caption_under_it(site):
    """A paragraph of plots is followed by a caption paragraph (``{: .caption }``) saying what its
    lines and shaded band are."""
    missing = []
    for name, page in pages(site).items():
        for i, p in enumerate(page.paragraphs):
            plots = [src for src in p["images"] if src.endswith(".png")]
            nxt = page.paragraphs[i + 1] if i + 1 < len(page.paragraphs) else None
            if plots and "caption" not in p["class"] and not (nxt and "caption" in nxt["class"] and nxt["text"].strip()):
                missing.append((name, plots[0]))
    assert not missing, missing


def test_no_page_holds_placeholder_text(site):
    """A cell, item or sentence standing for a figure not written in (``To be measured``, ``TBD``)."""
    placeholder = re.compile(r"(to be (measured|done|written|added)|TODO|TBD|FIXME|n/a yet|lorem ipsum)[.:]?",
                             re.IGNORECASE)
    found = {name: hits for name, page in pages(site).items()
             if (hits := [t.strip() for t in page.text if placeholder.fullmatch(t.strip())])}
    assert not found, found


def test_the_api_reference_shows_documentation_not_source(site):
    """PODSConfig is documented by its docstrings: its attributes, not ``field(...)`` calls or an
    unevaluated f-string."""
    api = "".join(pages(site)["python-api/index.html"].text)
    assert "PODSConfig" in api and "PODSTrainer" in api and "AsyncSampler" in api
    assert "field(" not in api and "f\"" not in api and "__post_init__" not in api
