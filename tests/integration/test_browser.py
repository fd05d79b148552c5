"""The executed notebooks in a real browser: JupyterLab started here, a headless Chromium (the system's,
driven by Playwright) opens the executed notebook of each stage that draws a figure and
sees the figure rendered (an <img> in the output area, decoded to a non-zero size).

Needs a Chromium on PATH (Debian: `apt-get install chromium`); skipped with one line where there is none.
`POETLAB_SCREENSHOT_DIR=experiments/browser pytest -m slow tests/integration/test_browser.py` also rewrites the
committed screenshots (one PNG per notebook, and progress.png); by default they go to the test's temporary folder.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from repo_paths import REPO

NOTEBOOKS = REPO / "experiments" / "notebooks"
CHROMIUM_FLAGS = [  # what a headless Chromium needs in a container with no network and no GPU
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]


def _figure_stages() -> list[str]:
    """The pipeline's stages that draw a figure (an experiments/figures/*.png among their outputs or plots):
    each one's executed notebook must show it."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    names = []
    for name, stage in stages.items():
        paths = [next(iter(out)) if isinstance(out, dict) else out for out in stage.get("outs", []) + stage.get("plots", [])]
        if any(path.startswith("experiments/figures/") and path.endswith(".png") for path in paths):
            names.append(name)
    return names


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    return None


def _screenshot_dir(tmp_path: Path) -> Path:
    """$POETLAB_SCREENSHOT_DIR (experiments/browser to rewrite the committed ones), else the test's folder."""
    out = Path(os.environ.get("POETLAB_SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """A JupyterLab server on a free local port serving a copy of experiments/notebooks/ (so nothing the
    browser does can touch the committed files), with its settings, workspaces and runtime files in a
    temporary folder; yields (base URL, token, the folder it serves)."""
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (pip install -e '.[pipeline]')")
    home = tmp_path_factory.mktemp("jupyter")
    root = home / "notebooks"
    shutil.copytree(NOTEBOOKS, root)
    port, token = _free_port(), secrets.token_hex(16)
    news = home / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false"}')  # no "get notified about Jupyter news?" toast over the screenshot
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(home / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"))
    log = (home / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--ServerApp.allow_root=True", "--LabApp.extension_manager=readonly",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=home,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5):
                    break
            except OSError:  # (refused, reset, timed out, or an HTTP error while it starts)
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start: {(home / 'server.log').read_text()[-2000:]}")
                time.sleep(0.5)
        yield base, token, root
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def browser(sync_api):
    """Headless Chromium from the system (no browser download), a fresh profile folder each run."""
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no Chromium installed; the browser test needs one (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile, sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=chromium, headless=True, args=CHROMIUM_FLAGS, viewport={"width": 1280, "height": 900}
        )
        yield context
        context.close()


@pytest.fixture(scope="module")
def sync_api():
    return pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")


@pytest.mark.slow
@pytest.mark.parametrize("name", _figure_stages())
def test_jupyterlab_renders_the_figure(name, sync_api, browser, jupyterlab, tmp_path):
    base, token, _ = jupyterlab
    page = browser.new_page()
    try:
        page.goto(f"{base}/lab/tree/{name}.ipynb?token={token}&reset", wait_until="domcontentloaded", timeout=120_000)
        page.locator(".jp-OutputArea-output").first.wait_for(state="attached", timeout=120_000)  # outputs rendered
        figure = page.locator(".jp-OutputArea-output img").first
        try:
            figure.wait_for(state="attached", timeout=20_000)
        except sync_api.TimeoutError:
            pytest.fail(f"{name}.ipynb shows no figure in JupyterLab (no <img> in any output area)")
        figure.scroll_into_view_if_needed(timeout=30_000)
        page.wait_for_function(
            "img => img.complete && img.naturalWidth > 0 && img.naturalHeight > 0", arg=figure.element_handle(), timeout=30_000
        )
        width, height = figure.evaluate("img => [img.naturalWidth, img.naturalHeight]")
        shown = figure.bounding_box()
        # the figure is a real decoded PNG of a matplotlib figure's size, and it takes space on the page
        assert width >= 300 and height >= 200, (width, height)
        assert shown is not None and shown["width"] > 100 and shown["height"] > 100, shown
        page.screenshot(path=str(_screenshot_dir(tmp_path) / f"{name}.png"))
    finally:
        page.close()


@pytest.mark.slow
def test_progress_bars_render_as_widgets_in_jupyterlab(sync_api, browser, jupyterlab, monkeypatch, tmp_path):
    """A cell that loops under poetlab's progress bar, run in JupyterLab's kernel: the bar is a widget
    drawn in the output area (not tqdm's "IProgress not found" text), and it reaches its total."""
    base, token, root = jupyterlab
    code = "from poetlab.progress import progress_bar\nfor _ in progress_bar(range(7), desc='bars', leave=True):\n    pass\n"
    cell = {"cell_type": "code", "execution_count": None, "id": "bars", "metadata": {}, "outputs": [], "source": code}
    notebook = {"cells": [cell], "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
                "nbformat": 4, "nbformat_minor": 5}
    (root / "progress.ipynb").write_text(json.dumps(notebook))
    page = browser.new_page()
    try:
        page.goto(f"{base}/lab/tree/progress.ipynb?token={token}&reset", wait_until="domcontentloaded", timeout=120_000)
        page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor").first.click(timeout=120_000)
        page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(timeout=120_000)  # kernel up
        page.keyboard.press("Shift+Enter")
        bar = page.locator(".jp-OutputArea-output .widget-hprogress .progress-bar").first  # ipywidgets' progress bar
        try:
            bar.wait_for(state="visible", timeout=60_000)
        except sync_api.TimeoutError:
            outputs = page.locator(".jp-OutputArea-output").all_inner_texts()
            pytest.fail(f"no progress widget in the output area; the outputs say {outputs}")
        page.get_by_text("7/7").first.wait_for(timeout=30_000)  # tqdm's label beside the bar: the loop ran to its end
        assert bar.evaluate("bar => bar.style.width") == "100%"
        assert "IProgress" not in "".join(page.locator(".jp-OutputArea-output").all_inner_texts())
        page.screenshot(path=str(_screenshot_dir(tmp_path) / "progress.png"))
    finally:
        page.close()
