"""A page in headless Chromium (Debian's `chromium`, driven by Playwright): what a test of a
report page checks. `.ci/run` installs Chromium and sets JAXSOCIAL_BROWSER=1, so there a
missing browser fails the test; elsewhere it skips it, naming what to install."""
import contextlib
import os
import shutil

import pytest

CHROMIUM = os.environ.get("JAXSOCIAL_CHROMIUM", "/usr/bin/chromium")
# As root in a sandbox with no network: no setuid sandbox, and none of Chromium's own
# background connections (each refused, and logged).
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def require_browser():
    """Skip (fail where JAXSOCIAL_BROWSER=1) unless Playwright and Chromium are installed."""
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("playwright (pip install -e '.[test]')")
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    if missing:
        message = "the browser test needs " + " and ".join(missing)
        if os.environ.get("JAXSOCIAL_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)


@contextlib.contextmanager
def launched():
    """One headless Chromium for several pages (`opened(path, browser)`)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def opened(path: str, browser=None):
    """(page, problems) for the file `path` loaded in headless Chromium (`browser`, default a
    new one): `problems` collects every console error or warning, uncaught exception and
    request that is not for the file itself (the page must open offline), as they happen."""
    if browser is None:
        with launched() as b, opened(path, b) as got:
            yield got
        return
    url = "file://" + os.path.abspath(path)
    problems = []
    page = browser.new_page()
    try:
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(f"uncaught: {e}"))
        page.on("request", lambda r: problems.append(f"request: {r.url[:120]}")
                if r.url != url else None)
        page.goto(url, wait_until="load")
        yield page, problems
    finally:
        page.close()


def page_problems(path: str, sections=(), browser=None) -> list:
    """What is wrong with the page at `path` in headless Chromium (`opened`'s problems), and
    every Plotly chart that did not render (a `.plotly-graph-div` without its SVG and layout),
    no chart at all, and each id of `sections` the page has no element for. [] for a good
    page."""
    with opened(path, browser) as (page, problems):
        total, drawn = page.evaluate(
            "() => { const d = Array.from(document.querySelectorAll('.plotly-graph-div'));"
            " return [d.length, d.filter(x => x.querySelector('svg.main-svg')"
            " && x._fullLayout).length]; }")
        if not total:
            problems.append("no chart on the page")
        if drawn < total:
            problems.append(f"{total - drawn} of {total} charts did not render")
        for s in sections:
            if not page.query_selector(f"#{s}"):
                problems.append(f"no section #{s}")
        return list(problems)
