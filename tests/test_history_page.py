"""The history page (`epmci history check --html DIR`) opened in a real browser: headless
Chromium (Debian's package here; the hosted CI image's Chrome) renders it; the charts are there with their points, the change
points are marked, and the pixels of the points' colour are on the screenshot."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from epmci.cli import main as epmci_main
from epmci.perf.history import FORMAT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
POINTS_RGB = np.array([0x1f, 0x77, 0xb4]) / 255          # matplotlib's first colour: the entries


def staircase_history(path, n_flat: int = 10, n_steps: int = 20) -> None:
    rng = np.random.default_rng(0)
    levels = [1.0] * n_flat + [0.99 ** (1 + k // 4) for k in range(n_steps)]
    with open(path, "w") as f:
        for i, lv in enumerate(levels):
            f.write(json.dumps({"format": FORMAT, "commit": f"{i:040x}", "profile": "epm-8gb", "model": "ci",
                                "metrics": {"decode_ratio_vs_base/baseline": lv * (1 + 0.005 * rng.standard_normal()),
                                            "peak_rss_mb/baseline": 300 + rng.standard_normal()}}) + "\n")


def pr_report(path) -> None:
    path.write_text(json.dumps({"suites": [{"name": "perf", "results": [
        {"name": "baseline: decode tok/s vs base main", "status": "pass",
         "properties": {"ratio": 0.9951, "ci_low": 0.9862, "ci_high": 1.0041, "verdict": "SAME"}}]}]}))


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    d = tmp_path_factory.mktemp("history")
    staircase_history(d / "h.jsonl")
    pr_report(d / "pr.json")
    rc = epmci_main(["history", "check", "--history", str(d / "h.jsonl"), "--html", str(d / "site"),
                     "--pr-report", str(d / "pr.json"), "--link", "JUnit=junit.xml", "--link", "summary=summary.md"])
    assert rc == 1                      # the staircase drifts
    return d / "site" / "index.html"


def test_the_page_holds_a_chart_per_metric_the_verdict_and_the_links(page):
    text = page.read_text()
    assert text.count("<svg") == 2 and 'id="points-decode-ratio-vs-base-baseline"' in text
    assert 'id=verdict class=fail>DRIFT in decode_ratio_vs_base/baseline' in text
    assert 'href="junit.xml"' in text and 'href="summary.md"' in text
    assert "x0.9951" in text and "[0.9862, 1.0041]" in text


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_chromium_renders_the_charts_with_their_points(page, tmp_path):
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                          page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # the browser parsed the inline SVG: the points' group holds the line drawn through 30 entries
    assert '<g id="points-decode-ratio-vs-base-baseline">' in dom.stdout
    assert 'id="change-point-decode-ratio-vs-base-baseline-' in dom.stdout
    shot = tmp_path / "page.png"
    r = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile2'}", f"--screenshot={shot}",
                        "--window-size=1200,1400", "--hide-scrollbars", page.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    import matplotlib.image
    img = matplotlib.image.imread(str(shot))[..., :3]
    near_points = (np.abs(img - POINTS_RGB).max(axis=-1) < 0.12).sum()
    assert near_points > 500, f"only {near_points} pixels of the points' colour on the screenshot"
