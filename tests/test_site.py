"""The docs site as a reader sees it: every page of the built MkDocs site rendered by headless Chromium
(Debian's `chromium`) at a laptop's width, and checked for lists run into the paragraph above them,
tables and code lines wider than what shows them (past the window's edge, or behind a scroll bar), and paper
pages without their result plots. Each page is served with a script that reads the rendered page
and writes what it found into the DOM Chromium dumps. Skipped, saying so, without Chromium;
`.ci/run` installs it."""

import functools
import html
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAPERS = ["heterofl", "fedepth", "fedsup", "inclusivefl", "mergesfl", "headtohead"]
CHROMIUM = shutil.which("chromium")
FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,900",
    "--virtual-time-budget=60000",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("site"),  # one worker builds and serves the site once
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium"),
]

CHECK = """
function check(doc) {  // after the page's load event: its images are in
  const article = doc.querySelector("article") || doc.body;
  const runOn = [...article.querySelectorAll("p")].map(p => p.textContent)
      .filter(t => /\\n\\s*([-*+]|\\d+\\.)\\s+\\S/.test(t)).map(t => t.slice(0, 80));
  const view = doc.documentElement.clientWidth;
  const clipped = e => {  // wider than what shows it: past the window, or behind a scroll bar
    if (e.getBoundingClientRect().right > view + 1) return true;
    for (let p = e; p && p !== doc.body; p = p.parentElement) {
      if (p.scrollWidth > p.clientWidth + 1 && getComputedStyle(p).overflowX !== "visible") return true;
    }
    return false;
  };
  const unreachable = [...article.querySelectorAll("table, pre > code")].filter(clipped)
      .map(t => t.textContent.trim().slice(0, 60));
  const images = [...article.querySelectorAll("img")]
      .map(i => [i.getAttribute("src"), i.complete && i.naturalWidth > 0]);
  return {runOn, unreachable, images};
}
"""
RUNNER = """<html><body><script>%s
addEventListener("load", async () => {
  const found = {};
  const pages = %s;
  async function visit(page) {
    const frame = document.createElement("iframe");
    frame.style.width = "1280px";
    frame.style.height = "900px";
    document.body.append(frame);
    await new Promise(done => { frame.onload = done; frame.src = page; });
    await new Promise(done => setTimeout(done, 500));  // the theme's scripts (tables' scroll containers)
    found[page] = check(frame.contentDocument);
    frame.remove();
  }
  for (let i = 0; i < pages.length; i += 8) {  // 8 frames at a time: a page's load mostly waits
    await Promise.all(pages.slice(i, i + 8).map(visit));
  }
  const out = document.createElement("pre");
  out.id = "rayfl-check";
  out.textContent = JSON.stringify(found);
  document.body.append(out);
});
</script></body></html>"""


def read(base: str, folder: Path, pages: list[str]) -> dict:
    """What the check found on each page (`PAGE/`, relative to the served `folder` at `base`),
    every page rendered by one headless Chromium in a frame of a laptop's width."""
    (folder / "rayfl-check.html").write_text(RUNNER % (CHECK, json.dumps(pages)))
    url = f"{base}/rayfl-check.html"
    dom = subprocess.run([CHROMIUM, *FLAGS, "--dump-dom", url], capture_output=True, text=True, timeout=600).stdout
    found = re.search(r'<pre id="rayfl-check">(.*?)</pre>', dom, re.S)
    assert found, f"{url}: the check did not finish"
    return json.loads(html.unescape(found.group(1)))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The built site, each page carrying the check, served on a free local port."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run(["mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)], cwd=ROOT, check=True, env=env)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield out, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture(scope="module")
def seen(site):
    """What the check found on every page of the site."""
    out, url = site
    pages = sorted(f"{p.parent.relative_to(out).as_posix()}/" for p in out.rglob("index.html"))
    return read(url, out, pages)


def test_every_page_renders_its_lists_and_tables_within_reach(seen):
    assert len(seen) > 20
    problems = {page: {k: found[k] for k in ("runOn", "unreachable") if found[k]} for page, found in seen.items()}
    assert {page: bad for page, bad in problems.items() if bad} == {}


def test_every_paper_page_shows_its_result_plots(seen):
    for paper in PAPERS:
        images = seen[f"{paper}/"]["images"]
        assert images and all(shown for _, shown in images), (paper, images)


def test_the_check_sees_a_run_on_list_clipped_tables_and_code_and_a_missing_plot(site):
    out, url = site
    wide = "<tr>" + "".join(f"<td>column-{k}-{'x' * 30}</td>" for k in range(30)) + "</tr>"
    scrolled = f'<div style="overflow-x: auto"><table>{wide.replace("column", "scrolled")}</table></div>'
    (out / "rayfl-bad.html").write_text(  # beside the site's pages, never one of them (`seen` reads index.html)
        "<html><body><article><p>What it shows:\n- a run-on item\n- another</p>"
        f"<table>{wide}</table>{scrolled}<pre><code>{'long-line ' * 300}</code></pre>"
        '<img src="missing.png"></article></body></html>'
    )
    found = read(url, out, ["rayfl-bad.html"])["rayfl-bad.html"]
    assert found["runOn"] and found["images"] == [["missing.png", False]]
    # past the window, behind a scroll bar, a code line past the window
    assert [t.split("-")[0] for t in found["unreachable"]] == ["column", "scrolled", "long"]
