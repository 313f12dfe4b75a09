"""The docs site as a reader sees it: every page of the built MkDocs site rendered by headless Chromium
(Debian's `chromium`) at a laptop's width, and checked for lists run into the paragraph above them,
tables wider than the page with no scroll container (their last columns out of reach), and paper
pages without their result plots. Each page is served with a script that reads the rendered page
and writes what it found into the DOM Chromium dumps. Skipped, saying so, without Chromium;
`.ci/run` installs it."""

import functools
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
    "--virtual-time-budget=15000",
]

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium")

READ = """<script>
addEventListener("load", async () => {
  await Promise.all([...document.images].map(i => i.decode().catch(() => 0)));
  const article = document.querySelector("article") || document.body;
  const runOn = [...article.querySelectorAll("p")].map(p => p.textContent)
      .filter(t => /\\n\\s*([-*+]|\\d+\\.)\\s+\\S/.test(t)).map(t => t.slice(0, 80));
  const space = article.clientWidth;
  const unreachable = [...article.querySelectorAll("table")].filter(table => {
    if (table.scrollWidth <= space + 1) return false;
    for (let e = table.parentElement; e && e !== article; e = e.parentElement) {
      const overflow = getComputedStyle(e).overflowX;
      if ((overflow === "auto" || overflow === "scroll") && e.clientWidth <= space + 1) return false;
    }
    return true;
  }).map(t => t.textContent.trim().slice(0, 60));
  const images = [...article.querySelectorAll("img")]
      .map(i => [i.getAttribute("src"), i.complete && i.naturalWidth > 0]);
  const out = document.createElement("pre");
  out.id = "rayfl-check";
  out.textContent = JSON.stringify({runOn, unreachable, images});
  document.body.append(out);
});
</script>"""


def read(url: str) -> dict:
    """What the check script found on the page at `url`, rendered by Chromium."""
    dom = subprocess.run([CHROMIUM, *FLAGS, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'<pre id="rayfl-check">(.*?)</pre>', dom, re.S)
    assert found, f"{url}: the check did not run"
    return json.loads(
        found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    )


def with_check(folder: Path) -> None:
    """Every page of a built site with the check script at the end of its body."""
    for page in folder.rglob("*.html"):
        page.write_text(page.read_text().replace("</body>", READ + "</body>"))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The built site, each page carrying the check, served on a free local port."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run(["mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)], cwd=ROOT, check=True, env=env)
    with_check(out)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield out, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_every_page_renders_its_lists_and_tables_within_reach(site):
    out, url = site
    pages = sorted(p.parent.relative_to(out).as_posix() for p in out.rglob("index.html"))
    assert len(pages) > 20
    problems = {}
    for page in pages:
        seen = read(f"{url}/{page}/")
        bad = {key: seen[key] for key in ("runOn", "unreachable") if seen[key]}
        if bad:
            problems[page] = bad
    assert problems == {}


def test_every_paper_page_shows_its_result_plots(site):
    _, url = site
    for paper in PAPERS:
        images = read(f"{url}/{paper}/")["images"]
        assert images and all(shown for _, shown in images), (paper, images)


def test_the_check_sees_a_run_on_list_a_table_out_of_reach_and_a_missing_plot(tmp_path):
    wide = "<tr>" + "".join(f"<td>column-{k}-{'x' * 30}</td>" for k in range(30)) + "</tr>"
    (tmp_path / "index.html").write_text(
        "<html><body><article><p>What it shows:\n- a run-on item\n- another</p>"
        f'<table>{wide}</table><img src="missing.png"></article></body></html>'
    )
    with_check(tmp_path)
    seen = read((tmp_path / "index.html").as_uri())
    assert seen["runOn"] and seen["unreachable"] and seen["images"] == [["missing.png", False]]
