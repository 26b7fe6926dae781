"""Pages in a browser: Debian's chromium driven by Playwright, a daemon's page
open at a laptop's or a phone's size (:class:`MonitorPage`), the checks every
page passes (:func:`check_page_basics`), lbmr-analyze's report open offline
(:class:`ReportPage`), and the script that finds overlapping blocks, for both."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

#: Debian's chromium (scripts/test installs it); Playwright drives it and downloads nothing
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: the sizes a page must read at: a laptop screen and a phone
PAGE_SIZES = {"wide": (1280, 800), "narrow": (390, 844)}
#: a page's blocks: no two may overlap (unless one holds the other)
PAGE_BLOCKS = "header,h1,h2,h3,summary,section.card,div.tile,div.tools,div.scroll,svg.topology,div.legend,p.note"

#: The report's main blocks, none of which may overlap another (unless one contains the other).
REPORT_BLOCKS = "h1,h2,h3,p,img,input.filter,div.scroll,table.kinds,section.kind,details.finding,ul.tfindings"

#: A script taking a CSS selector and returning {checked, bad}: how many visible
#: elements it selects, and the pairs of them whose boxes overlap (by more than
#: half a pixel each way) without one containing the other.
OVERLAPS_JS = """sel => {
  const els = Array.from(document.querySelectorAll(sel)).filter(e => e.checkVisibility({visibilityProperty: true}));
  const box = els.map(e => e.getBoundingClientRect());
  const name = e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (e.className ? '.' + e.className : '')
                    + ' "' + e.textContent.trim().slice(0, 40) + '"';
  const bad = [];
  for (let i = 0; i < els.length; i++) for (let j = i + 1; j < els.length; j++) {
    if (els[i].contains(els[j]) || els[j].contains(els[i])) continue;
    const a = box[i], b = box[j];
    const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
    const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
    if (w > 0.5 && h > 0.5) bad.push(name(els[i]) + ' / ' + name(els[j]));
  }
  return {checked: els.length, bad: bad};
}"""


def launch_chromium(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])


@pytest.fixture(scope="module")
def headless_chromium():
    """The fixture of a module's pages: chromium, headless, closed after the module
    (a test module takes it as ``browser = headless_chromium``)."""
    with sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()


class MonitorPage:
    """A daemon's page (``base``: ``http[s]://host:port``) open in a fresh
    browser context of ``size`` (a :data:`PAGE_SIZES` key), with what it
    logged, every request it made and every dialog it opened; ``credentials``:
    (user, password): what a person types when the browser asks (HTTP basic
    authentication, after the endpoint's 401 challenge)."""

    def __init__(self, browser, base: str, size: str = "wide", *, credentials=None,
                 ignore_https_errors: bool = False) -> None:
        w, h = PAGE_SIZES[size]
        self.base = base
        self.context = browser.new_context(
            viewport={"width": w, "height": h}, ignore_https_errors=ignore_https_errors,
            http_credentials=None if credentials is None else {"username": credentials[0],
                                                                 "password": credentials[1]})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.responses: list[tuple[int, str]] = []
        self.dialogs: list[str] = []
        self.page.on("response", lambda r: self.responses.append((r.status, r.url)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def open(self, path: str = "/", timeout: float = 20.0) -> MonitorPage:
        """Load the page and wait until its data came (the header says "updated")."""
        self.page.goto(self.base + path, wait_until="load")
        self.wait_updated(timeout)
        return self

    def wait_updated(self, timeout: float = 20.0) -> None:
        self.page.wait_for_function(
            "() => (document.getElementById('updated') || {}).textContent.startsWith('updated')",
            timeout=timeout * 1000)

    def js(self, script: str, arg=None):
        return self.page.evaluate(script, arg)

    def overlaps(self) -> dict:
        return self.js(OVERLAPS_JS, PAGE_BLOCKS)

    def horizontal_overflow(self) -> int:
        """Pixels the document is wider than the window (0: no sideways scrolling)."""
        return self.js("() => document.documentElement.scrollWidth - window.innerWidth")

    def column(self, table_id: str, index: int) -> list[str]:
        return self.js("""([id, i]) => Array.from(document.getElementById(id).tBodies[0].rows)
                          .filter(r => !r.classList.contains('empty')).map(r => r.cells[i].textContent)""",
                       [table_id, index])

    def screenshot(self, path, full_page: bool = False) -> bytes:
        return self.page.screenshot(path=str(path), full_page=full_page)

    def close(self) -> None:
        self.context.close()


def check_page_basics(p: MonitorPage) -> None:
    """No console error, no request outside the endpoint, every answer 200, no dialog, no
    overlapping blocks, no sideways scrolling of the whole page."""
    assert p.errors == [], p.errors
    assert p.requests and all(u.startswith(p.base + "/") for u in p.requests), p.requests
    assert all(status == 200 for status, _ in p.responses if status != 401), p.responses  # 401: the challenge
    assert p.dialogs == []
    ov = p.overlaps()
    assert ov["checked"] > 5 and ov["bad"] == [], ov
    assert p.horizontal_overflow() <= 0


def keep_shot(path: Path, name: str) -> None:
    """Copy a screenshot into the directory ``LBMR_PAGE_SHOTS`` names, if it is set."""
    if os.environ.get("LBMR_PAGE_SHOTS"):
        shutil.copy(path, Path(os.environ["LBMR_PAGE_SHOTS"]) / name)


class ReportPage:
    """A report (an HTML file) open in a fresh offline browser context ``width``
    pixels wide, its full-page screenshot written to ``shot``, with what it
    logged and every request it made."""

    def __init__(self, browser, report: Path, shot: Path, width: int) -> None:
        self.context = browser.new_context(viewport={"width": width, "height": 1000}, offline=True)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(report.as_uri(), wait_until="load")
        self.page.screenshot(path=str(shot), full_page=True)
        self.shot = shot

    def js(self, script: str, arg=None):
        return self.page.evaluate(script, arg)

    def box(self, selector: str) -> dict:
        """The bounding box of the first element ``selector`` finds (CSS pixels)."""
        return self.page.locator(selector).first.bounding_box()

    def y(self, selector: str) -> float:
        return self.box(selector)["y"]

    def close(self) -> None:
        self.context.close()
