"""The docs site as a reader sees it: every page of the built MkDocs site rendered in headless Chromium
(Debian's `chromium` and `chromium-driver`, driven by Selenium) at a laptop's width, and checked for
lists run into the paragraph above them, tables wider than the page with no scroll container (their
last columns out of reach), and paper pages without their result plots. Skipped, saying so, where
Chromium is not installed; `.ci/run` installs it."""

import functools
import http.server
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAPERS = ["heterofl", "fedepth", "fedsup", "inclusivefl", "mergesfl", "headtohead"]
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver")

READ = """
const article = document.querySelector("article") || document.body;
const runOn = [...article.querySelectorAll("p")].map(p => p.textContent)
    .filter(t => /\\n\\s*([-*+]|\\d+\\.)\\s+\\S/.test(t)).map(t => t.slice(0, 80));
const unreachable = [...article.querySelectorAll("table")].filter(table => {
    const space = article.clientWidth;
    if (table.scrollWidth <= space + 1) return false;
    for (let e = table.parentElement; e && e !== article; e = e.parentElement) {
        const overflow = getComputedStyle(e).overflowX;
        if ((overflow === "auto" || overflow === "scroll") && e.clientWidth <= space + 1) return false;
    }
    return true;
}).map(t => t.textContent.trim().slice(0, 60));
const images = [...article.querySelectorAll("img")].map(i => [i.getAttribute("src"), i.complete && i.naturalWidth > 0]);
return {runOn, unreachable, images};
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The built site, served on a free local port."""
    out = tmp_path_factory.mktemp("site")
    subprocess.run(
        ["mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        check=True,
        env={"NO_MKDOCS_2_WARNING": "1", **__import__("os").environ},
    )
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield out, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--window-size=1280,900"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


def read(browser, url: str) -> dict:
    browser.get(url)
    browser.execute_async_script(
        "const done = arguments[0]; Promise.all([...document.images].map(i => i.decode().catch(() => 0))).then(done)"
    )
    return browser.execute_script(READ)


def test_every_page_renders_its_lists_and_tables_within_reach(site, browser):
    out, url = site
    pages = sorted(p.relative_to(out) for p in out.rglob("index.html") if "search" not in p.parts)
    assert len(pages) > 20
    problems = {}
    for page in pages:
        seen = read(browser, f"{url}/{page.parent.as_posix()}/")
        bad = {k: seen[k] for k in ("runOn", "unreachable") if seen[k]}
        if bad:
            problems[str(page.parent)] = bad
    assert problems == {}


def test_every_paper_page_shows_its_result_plots(site, browser):
    _, url = site
    for paper in PAPERS:
        images = read(browser, f"{url}/{paper}/")["images"]
        assert images and all(shown for _, shown in images), (paper, images)


def test_the_checks_see_a_run_on_list_and_a_table_out_of_reach(browser, tmp_path):
    # the two faults the site checks look for, drawn by hand: both must be found
    wide = "<tr>" + "".join(f"<td>column-{k}-{'x' * 30}</td>" for k in range(30)) + "</tr>"
    (tmp_path / "bad.html").write_text(
        f"<html><body><article><p>What it shows:\n- a run-on item\n- another</p><table>{wide}</table>"
        '<img src="missing.png"></article></body></html>'
    )
    seen = read(browser, (tmp_path / "bad.html").as_uri())
    assert seen["runOn"] and seen["unreachable"] and seen["images"] == [["missing.png", False]]
