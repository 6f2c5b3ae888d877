"""The HTML reports in a real browser: Debian's Chromium, headless, driven by Playwright
(issue 17, point 5). Each report (the demo, metrics with slices, a partial run, failures)
is opened at 1,440 px and at 420 px: no console errors, nothing wider than the window,
every expected section and plot there, and the axis labels right.

Skipped, with the reason, only where no Chromium is installed (``apt-get install -y
chromium``; ``.ci/run`` does it). With ``CHUTE_SCREENSHOTS=DIR`` the pages are saved as
``DIR/<report>-<width>.png`` (docs/img holds the ones the README shows).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import reports

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium installed (apt-get install -y chromium): the reports are not rendered",
)
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

WIDTHS = (1440, 420)
COMMON = ["output", "runs", "throughput", "stages"]
EXPECTED: dict[str, tuple[Callable[[Path], Path], list[str], dict[str, tuple[str, str]]]] = {
    "demo": (
        reports.demo_report,
        COMMON,
        {
            "rows/s over time": ("seconds of run time", "rows/s"),
            "rows written, cumulative": ("seconds of run time", "rows"),
            "busy time per stage": ("busy seconds (summed over replicas / threads)", "stage"),
        },
    ),
    "metrics": (
        reports.metrics_report,
        [*COMMON, "failures", "metrics", "plots"],
        {
            "ROC — m/auc_roc": ("false positive rate", "true positive rate"),
            "precision-recall — m/auc_roc": ("recall", "precision"),
            "scores — m/auc_roc": ("score", "rows"),
            "ROC by region — m/auc_s": ("false positive rate", "true positive rate"),
            "precision-recall by region — m/auc_s": ("recall", "precision"),
            "busy time per stage": ("busy seconds (summed over replicas / threads)", "stage"),
        },
    ),
    "partial": (reports.partial_report, [*COMMON, "stopped"], {}),  # rows may be 0
    "failures": (
        reports.failures_report,
        [*COMMON, "failures"],
        {"busy time per stage": ("busy seconds (summed over replicas / threads)", "stage")},
    ),
}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright.sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", list(EXPECTED))
def test_report_in_chromium(name: str, browser: Any, tmp_path: Path) -> None:
    build, sections, plots = EXPECTED[name]
    page_path = build(tmp_path) / "_chute" / "report.html"
    for width in WIDTHS:
        page = browser.new_page(viewport={"width": width, "height": 900})
        errors = _errors(page)
        page.goto(page_path.as_uri())
        assert errors == [], errors
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        found = page.evaluate("[...document.querySelectorAll('section')].map(s => s.id)")
        assert set(sections) <= set(found), (sections, found)
        for title, (xlabel, ylabel) in plots.items():
            figure = page.locator(f"figure[data-title='{title}']")
            assert figure.count() == 1, title
            assert figure.locator("text.xlabel").text_content() == xlabel
            assert figure.locator("text.ylabel").text_content() == ylabel
            box = figure.locator("svg").bounding_box()
            assert box is not None and 0 < box["width"] <= width and box["height"] > 100
            svg_title = figure.locator("text.title").text_content()
            assert svg_title == title  # text in the plot is text: selectable, searchable
        if name == "partial":
            assert "To resume:" in page.locator("#stopped").inner_text()
        _screenshot(page, name, width)
        page.close()


def _errors(page: Any) -> list[str]:
    """The console errors and uncaught exceptions of ``page``, as they come."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


def _screenshot(page: Any, name: str, width: int) -> None:
    folder = os.environ.get("CHUTE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}-{width}.png"), full_page=True)
