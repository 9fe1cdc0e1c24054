"""The self-contained HTML report opens in headless Chromium (Debian's chromium; scripts/test.sh installs it):
every embedded figure decodes, the tables are there, and the page draws something."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sparklab import report
from sparklab.report.model import Overrides
from sparklab.report.roofline import Device
from sparklab.sweep.store import Store
from tests.reportkit import cpu_run

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        message = "no chromium on PATH (Debian: apt-get install chromium; scripts/test.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must check the HTML report, but {message}")
        pytest.skip(message)
    return found


def _chromium(binary: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    return subprocess.run([binary, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=120)


def test_html_report_renders_in_headless_chromium(chromium: str, tmp_path: Path) -> None:
    path = cpu_run(tmp_path / "runs")
    with Store.open(path, readonly=True) as store:
        built = report.build(store, path.parent.name, Overrides(Device("given", 20.0)))
    files = report.write_all(built, tmp_path / "out")
    html = tmp_path / "out" / "report.html"
    assert html in files
    assert "plots/" not in html.read_text()  # self-contained: figures inlined, no file links

    dom = _chromium(chromium, tmp_path, "--virtual-time-budget=10000", "--dump-dom", html.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "figures: 5 of 5 rendered" in dom.stdout  # the 4 per-workload plots and the loss bars
    assert "Best configuration per concurrency" in dom.stdout and "<table>" in dom.stdout

    shot = tmp_path / "shot.png"
    done = _chromium(chromium, tmp_path, "--window-size=1280,2000", f"--screenshot={shot}", html.as_uri())
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    from PIL import Image

    with Image.open(shot) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert image.size == (1280, 2000)
    assert colours is not None and len(colours) > 50  # text, tables and plot colours, not a blank page
