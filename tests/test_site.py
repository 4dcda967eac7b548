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

# every test here reads the site, built once per module (mkdocs, half a minute or more); -m 'not slow' skips them all
pytestmark = pytest.mark.slow


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


# --------------------------------------------------------------------------- in a browser

KEY_PAGES = ["", "getting-started/", "configuration/", "will-pods-pay/", "experiments/",
             "experiments/compare-2digit/", "trl/", "python-api/", "async/"]
BROWSER = "/usr/bin/chromium"
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"]

LAYOUT = """() => {
  const article = document.querySelector('article');
  const tables = [...article.querySelectorAll('table')].map(t => {
    const wrap = t.closest('.md-typeset__scrollwrap');
    return {scrolls: !!wrap && ['auto', 'scroll'].includes(getComputedStyle(wrap).overflowX),
            cut: !wrap && t.scrollWidth > article.clientWidth + 1, head: t.rows[0] ? t.rows[0].innerText.slice(0, 40) : ''};
  });
  const code = [...article.querySelectorAll('pre > code')].map(c => {
    const button = c.parentElement.querySelector('.md-code__button');
    const box = c.getBoundingClientRect();
    return {wraps: getComputedStyle(c).whiteSpace !== 'pre',
            under: !!button && box.width > 0 && box.right > button.getBoundingClientRect().left + 0.5,
            text: c.innerText.slice(0, 40)};
  });
  return {text: article.innerText, tables, code};
}"""


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP on localhost, as a reader's browser gets it."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    if not Path(BROWSER).exists():
        pytest.skip(f"no browser at {BROWSER} (Debian's chromium: make install-browser)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the [docs] extra)")
    with sync_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=BROWSER, args=BROWSER_ARGS)
        yield launched
        launched.close()


@pytest.mark.parametrize("width", [1400, 420])
def test_key_pages_render_cleanly_in_a_browser(served, browser, width, tmp_path):
    """Each key page at a wide and a phone's width, after the theme's scripts ran: no escaped bar,
    every table scrolls inside its box (none runs out of sight), code never wraps and no line runs
    under the copy button. The screenshots are left in the test's folder for a reader."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    problems = []
    try:
        for path in KEY_PAGES:
            page.goto(served + path, wait_until="load")
            seen = page.evaluate(LAYOUT)
            page.screenshot(path=str(tmp_path / f"{path.strip('/').replace('/', '_') or 'home'}-{width}.png"), full_page=True)
            where = f"{path or 'home'} at {width} px"
            problems += [f"{where}: a literal \\| shows" for _ in [1] if "\\|" in seen["text"]]
            problems += [f"{where}: table {t['head']!r} is cut off" for t in seen["tables"] if t["cut"] or not t["scrolls"]]
            problems += [f"{where}: code {c['text']!r} wraps" for c in seen["code"] if c["wraps"]]
            problems += [f"{where}: code {c['text']!r} runs under the copy button" for c in seen["code"] if c["under"]]
    finally:
        page.close()
    assert not problems, problems
    assert len(list(tmp_path.glob("*.png"))) == len(KEY_PAGES)
