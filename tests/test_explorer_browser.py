"""The attention explorer (GET /explorer) in a real browser: Debian's chromium, driven by
selenium through the system chromedriver, against `attnserve serve` on 127.0.0.1 over the
shared longformer export (8,200 tokens, with its analysis graph).

Checked: the page loads with no console errors and asks for the API key; maps for a 30-token
and a 4,000-token text (pixels drawn, another layer draws others); hover names the query and
key tokens; a click highlights what a token attends to; the rank-collapse chart draws the four
paths of /rank_collapse on a log scale, one point per layer; dragging zooms into exact weights; compare mode calls a peer across origins (CORS). Printed, not asserted: the page's load time and
the first 4,000-token map against one /attention grid call.

Screenshots: each variant in ATTNSERVE_EXPLORER_VARIANTS (default longformer, whose export the
suite shares) draws the same sample document; with ATTNSERVE_EXPLORER_SCREENSHOTS=docs they go
to docs/explorer-<variant>.png, otherwise to a temporary folder:

    ATTNSERVE_EXPLORER_SCREENSHOTS=docs ATTNSERVE_EXPLORER_VARIANTS=local,longformer,bigbird,lsh,linformer \\
        pytest -q tests/test_explorer_browser.py -k screenshot
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import httpx
import pytest
from export_helpers import SHARED_MAX_LENGTH, SHARED_VARIANT, get_export
from http_server import ROOT, ServerProcess, start_real_server

from attnserve.bench.service import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = "/usr/bin/chromedriver"
if not (CHROMIUM and Path(CHROMEDRIVER).is_file()):
    pytest.skip("no browser: Debian's chromium and chromium-driver are not installed (.ci/run installs them: "
                "apt-get install -y chromium chromium-driver)", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the test extra: pip install -e '.[test]'")
from selenium.webdriver import ActionChains  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

# Needs the machine to itself: pytest-xdist runs this group on one worker, one test at a time.
pytestmark = pytest.mark.xdist_group("whole_machine")

API_KEY = "explorer-key-1"
MARGIN = 96  # explorer.js: the map starts this many pixels right of and below the canvas corner
# Never let selenium look for or download a driver: the system one is named explicitly.
os.environ["SE_OFFLINE"] = "true"
WORDS = "the quick brown fox jumps over the lazy dog while a cat watches from the warm sunny window".split()
SCREENSHOT_VARIANTS = os.environ.get("ATTNSERVE_EXPLORER_VARIANTS", SHARED_VARIANT).split(",")
SCREENSHOT_MAX_LENGTH = 2048  # variants other than the shared export: enough for the sample document


def text_of(n_tokens: int) -> str:
    """A text of exactly n_tokens tokens ([CLS] and [SEP] included): every word is one token."""
    return " ".join(WORDS[i % len(WORDS)] for i in range(n_tokens - 2))


# 4,000-token maps of the windowed variants cost more than the default 1,024 MB budget.
SERVER_ARGS = ("--api-key", API_KEY, "--providers", "CPUExecutionProvider", "--max-request-memory-mb", "4096")


def open_browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1500"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@pytest.fixture(scope="module")
def server():
    export_dir, _ = get_export(SHARED_VARIANT, SHARED_MAX_LENGTH)
    # Its own peer under a second name: a page from 127.0.0.1 calling localhost is a
    # cross-origin call, so compare mode and CORS are exercised without a second model.
    port = free_port()
    argv = ["-m", "attnserve", "serve", "--export-dir", str(export_dir), "--port", str(port), "--log-level", "warning",
            "--explorer-peers", f"http://127.0.0.1:{port},http://localhost:{port}", *SERVER_ARGS]
    proc = ServerProcess(argv, port).wait_ready(180)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def browser():
    driver = open_browser()
    yield driver
    driver.quit()


def console_errors(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def wait(driver, condition, timeout: float = 300):
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: d.execute_script(condition))


@pytest.fixture
def logged_in(server, browser):
    """The browser on the explorer with the key given: by test_page_loads_and_asks_for_the_key
    when it ran first, else here, so that each test also runs alone (-k)."""
    if not browser.execute_script("const l = document.getElementById('layer'); return !!l && l.options.length > 0"):
        log_in(browser, server.url)
    return browser


def log_in(driver, url: str) -> float:
    """Open the explorer, give it the key, wait until it knows the model; the page's load time (s)."""
    driver.get(url + "/explorer")
    load = driver.execute_script("const t = performance.getEntriesByType('navigation')[0]; return t.loadEventEnd - t.startTime;") / 1000
    wait(driver, "return document.getElementById('status').textContent.includes('API key')", 30)
    driver.find_element(By.ID, "api-key").send_keys(API_KEY)
    driver.find_element(By.ID, "key-save").click()
    wait(driver, "return document.getElementById('layer').options.length > 0 && document.getElementById('status').textContent.startsWith('Ready')", 30)
    return load


def draw(driver, text: str, layer: int | None = None) -> float:
    """Put `text` in the page (and pick `layer`), press Show, wait for the map; the page's own
    time from the click to the drawn map (s)."""
    before = driver.execute_script("return Number(document.getElementById('map').dataset.ready || 0)")
    driver.execute_script("document.getElementById('input').value = arguments[0]", text)
    if layer is not None:
        # Changing the layer redraws at once when a map is shown; Show below asks for the same.
        driver.execute_script("const s = document.getElementById('layer'); s.value = String(arguments[0]);", layer)
    driver.find_element(By.ID, "show").click()
    wait(driver, f"return Number(document.getElementById('map').dataset.ready || 0) > {before} && !document.getElementById('map').dataset.busy")
    status = driver.find_element(By.ID, "status")
    assert "error" not in (status.get_attribute("class") or ""), status.text
    return float(driver.find_element(By.ID, "map").get_attribute("data-ms")) / 1000


def map_pixels(driver) -> tuple[str, int]:
    """(a digest of the map's pixels, how many distinct colours it has)."""
    return driver.execute_script(f"""
        const c = document.getElementById('map'), side = c.width - {MARGIN};
        const d = c.getContext('2d').getImageData({MARGIN}, {MARGIN}, side, side).data;
        let h = 0; const colours = new Set();
        for (let i = 0; i < d.length; i += 4) {{
            const v = (d[i] << 16) | (d[i + 1] << 8) | d[i + 2];
            if (d[i + 3]) colours.add(v);
            h = (Math.imul(h, 31) + v + d[i + 3]) | 0;
        }}
        return [String(h), colours.size];""")


def test_page_loads_and_asks_for_the_key(server, browser):
    load = log_in(browser, server.url)
    print(f"\nexplorer page load: {load * 1000:.0f} ms")
    assert Select(browser.find_element(By.ID, "layer")).options[-1].text == "5"
    assert len(Select(browser.find_element(By.ID, "head")).options) == 13  # mean and 12 heads
    assert "longformer" in browser.find_element(By.ID, "variant").text
    assert console_errors(browser) == []


def test_short_text_map_hover_click_and_rank_collapse(server, browser, logged_in):
    draw(browser, text_of(30), layer=0)
    answer = browser.execute_script("return state.answer")
    assert answer["n_tokens"] == 30 and answer["cell_tokens"] == 1
    digest, colours = map_pixels(browser)
    assert colours > 3  # not blank: the map's own colours, not only the background
    draw(browser, text_of(30), layer=4)
    assert map_pixels(browser)[0] != digest

    # Hover the cell of query 5 and key 5 (the band's diagonal).
    px = browser.execute_script("return main.px")
    canvas = browser.find_element(By.ID, "map")
    size = canvas.size
    x, y = MARGIN + 5.5 * px - size["width"] / 2, MARGIN + 5.5 * px - size["height"] / 2
    ActionChains(browser).move_to_element_with_offset(canvas, int(x), int(y)).perform()
    tip = browser.find_element(By.ID, "tooltip")
    assert tip.is_displayed()
    word = WORDS[4]  # token 5 is the fifth word ([CLS] is token 0)
    assert f'query 5 "{word}"' in tip.text and f'key   5 "{word}"' in tip.text and "weight" in tip.text

    # Click a token of the text: what it attends to is highlighted.
    browser.find_element(By.CSS_SELECTOR, '#text .tok[data-i="7"]').click()
    wait(browser, "return document.querySelectorAll('#text .tok.hl').length > 0", 120)
    highlighted = browser.find_elements(By.CSS_SELECTOR, "#text .tok.hl")
    assert 1 < len(highlighted) <= 30
    assert browser.find_element(By.CSS_SELECTOR, "#text .tok.selected").get_attribute("data-i") == "7"

    # The four paths of /rank_collapse on a log scale, drawn from the server's answer.
    wait(browser, "return state.collapse && Number(document.getElementById('rank').dataset.ready || 0) > 0", 120)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#rank circle")) == 6
    curves = browser.find_elements(By.CSS_SELECTOR, "#rank polyline")
    assert [c.get_attribute("data-path") for c in curves] == ["model", "attention_only", "attention_skip", "attention_mlp"]
    assert all(len(c.get_attribute("points").split()) == 7 for c in curves)  # the embeddings and six layers
    with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {API_KEY}"}, timeout=120) as client:
        direct = client.post("/rank_collapse", json={"inputs": text_of(30), "truncate": True}).json()
    assert browser.execute_script("return state.collapse") == direct
    heights = {c.get_attribute("data-path"): [float(p.split(",")[1]) for p in c.get_attribute("points").split()] for c in curves}
    # SVG y grows downwards: pure attention ends far below the model (rank collapse), on a log axis.
    assert heights["attention_only"][-1] > heights["model"][-1] + 50
    assert console_errors(browser) == []


def test_compare_mode_draws_each_peer(server, browser, logged_in):
    """The server is its own peer as http://localhost:port: a cross-origin call with the key,
    answered through CORS, drawn beside the main map and labelled with the peer's variant."""
    box = browser.find_element(By.ID, "compare")
    assert box.is_displayed() and not box.is_selected()
    box.click()
    draw(browser, text_of(30), layer=2)
    wait(browser, "return document.querySelectorAll('#peers .peer canvas[data-ready]').length === 1", 120)
    wait(browser, "return document.querySelectorAll('#peers .peer svg[data-ready]').length === 1", 120)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#peers .peer svg polyline")) == 4  # the peer's four paths
    title = browser.find_element(By.CSS_SELECTOR, "#peers .peer h3").text
    assert title.startswith("longformer {") and f"localhost:{server.port}" in title
    assert browser.execute_script("return document.querySelectorAll('#peers .peer').length") == 1  # not itself again
    box.click()
    assert console_errors(browser) == []


def test_long_text_map_zoom_and_timing(server, browser, logged_in):
    text = text_of(4000)
    body = {"inputs": text, "layer": 1, "head": None, "format": "grid", "max_cells": 256, "truncate": True}
    with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {API_KEY}"}, timeout=300) as client:
        started = time.perf_counter()  # one /attention grid call, then the page's map of the same text
        r = client.post("/attention", json=body)
        call = time.perf_counter() - started
        assert r.status_code == 200
    shown = draw(browser, text, layer=1)
    answer = browser.execute_script("return state.answer")
    assert answer["n_tokens"] == 4000 and answer["cell_tokens"] == 16
    assert map_pixels(browser)[1] > 3
    assert r.json()["grid"] == answer["grid"]
    server_ms, draw_ms = (float(browser.find_element(By.ID, "map").get_attribute(f"data-{k}")) for k in ("server-ms", "draw-ms"))
    print(f"\n4,000-token map in the page: {shown * 1000:.0f} ms from the click (server {server_ms:.0f} ms, "
          f"parsing and drawing {draw_ms:.0f} ms); the /attention grid call before it: {call * 1000:.0f} ms")

    # Drag over the first 4 x 4 cells: a 64-token window, drawn from exact weights.
    px = browser.execute_script("return main.px")
    canvas = browser.find_element(By.ID, "map")
    size = canvas.size
    at = lambda cell: int(MARGIN + (cell + 0.5) * px - size["width"] / 2)  # noqa: E731 (square canvas area)
    before = int(canvas.get_attribute("data-ready"))
    ActionChains(browser).move_to_element_with_offset(canvas, at(0), int(MARGIN + 0.5 * px - size["height"] / 2)).click_and_hold() \
        .move_to_element_with_offset(canvas, at(3), int(MARGIN + 3.5 * px - size["height"] / 2)).release().perform()
    wait(browser, f"return Number(document.getElementById('map').dataset.ready) > {before} && !document.getElementById('map').dataset.busy")
    zoomed = browser.execute_script("return state.answer")
    assert zoomed["query_range"] == [0, 64] and zoomed["key_range"] == [0, 64] and zoomed["cell_tokens"] == 1
    assert len(zoomed["grid"]) == 64
    # Past the server's rank-collapse limit (a quarter of max_length) the paths follow the text's first tokens.
    limit = browser.execute_script("return state.info.rank_collapse_max_length")
    wait(browser, "return state.collapse !== undefined && document.getElementById('rank-note').textContent.includes('first')", 300)
    assert f"first {limit - 4} tokens" in browser.find_element(By.ID, "rank-note").text
    assert browser.execute_script("return state.collapse.n_tokens") <= limit
    assert console_errors(browser) == []


@pytest.mark.parametrize("variant", SCREENSHOT_VARIANTS)
def test_screenshot(variant, tmp_path):
    """The same sample document through `variant`'s server, the view saved as a PNG."""
    from PIL import Image

    if variant == SHARED_VARIANT:
        export_dir, _ = get_export(SHARED_VARIANT, SHARED_MAX_LENGTH)
    else:
        export_dir, _ = get_export(variant, SCREENSHOT_MAX_LENGTH, analysis=True)
    out_dir = ROOT / os.environ["ATTNSERVE_EXPLORER_SCREENSHOTS"] if os.environ.get("ATTNSERVE_EXPLORER_SCREENSHOTS") else tmp_path
    samples = json.loads((ROOT / "src" / "attnserve" / "service" / "static" / "explorer" / "samples.json").read_text())["samples"]
    proc = start_real_server(export_dir, *SERVER_ARGS)
    driver = open_browser()
    try:
        log_in(driver, proc.url)
        Select(driver.find_element(By.ID, "sample")).select_by_index(2)  # the second sample, about 1,000 tokens
        assert driver.find_element(By.ID, "input").get_attribute("value") == samples[1]["text"]
        Select(driver.find_element(By.ID, "head")).select_by_value("0")
        draw(driver, samples[1]["text"], layer=0)
        wait(driver, "return Number(document.getElementById('rank').dataset.ready || 0) > 0", 300)  # the curves beside it
        path = out_dir / f"explorer-{variant}.png"
        driver.find_element(By.ID, "view").screenshot(str(path))
        assert console_errors(driver) == []
    finally:
        driver.quit()
        proc.stop()
    with Image.open(path) as image:
        assert image.width > 600 and len(image.convert("RGB").getcolors(1 << 20) or ()) > 10
