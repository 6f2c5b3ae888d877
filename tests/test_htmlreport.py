"""The HTML report's content, read as text (issue 17, point 4); tests/test_browser.py
looks at the same pages in Chromium."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from chute.cli import main
from chute.htmlreport import rates
from chute.svgplot import ticks
from tests import reports


def _page(out: Path) -> str:
    return (out / "_chute" / "report.html").read_text()


def _section(page: str, name: str) -> str:
    return page.split(f"<section id='{name}'>")[1].split("</section>")[0]


def _figure(page: str, title: str) -> str:
    return page.split(f"<figure data-title='{title}'>")[1].split("</figure>")[0]


@pytest.mark.timeout(120)
def test_the_report_is_drawn_without_matplotlib_and_its_text_stays_text(tmp_path: Path) -> None:
    out = reports.failures_report(tmp_path)
    script = (
        "import sys, json; sys.modules['matplotlib'] = None\n"
        "from chute.htmlreport import render\n"
        f"print(render(json.load(open({str(out / '_chute' / 'report.json')!r}))))"
    )
    page = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert page.rstrip("\n") == _page(out)  # the same page, with no plotting library at all
    busy = _figure(page, "busy time per stage")
    assert "<text class='xlabel'" in busy and ">busy seconds (summed over replicas" in busy
    assert re.search(r"class='ylabel'[^>]*>stage<", busy)  # the stages are on the y axis
    assert "class='category'" in busy and ">m</text>" in busy
    assert "summed over each stage's replicas or threads" in _section(page, "stages")
    assert "viewBox='0 0 " in page and "width=device-width" in page


@pytest.mark.timeout(120)
def test_header_rate_failures_and_sliced_metrics(tmp_path: Path) -> None:
    out = reports.metrics_report(tmp_path)
    page = _page(out)
    header = page.split("<header>")[1].split("</header>")[0]
    assert str(tmp_path / "data") in header and "<b>models</b> m" in header
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC – \d{4}-", header)
    assert re.search(r"chute \d+\.\d+", header)
    rate = _figure(page, "rows/s over time")
    assert re.search(r"class='ylabel'[^>]*>rows/s<", rate)
    points = re.search(r"<polyline class='series' points='([^']*)'", rate)
    assert points is not None and len(points.group(1).split()) >= 8  # a rate, enough points
    failures = _section(page, "failures")
    assert f"{out}/_errors/" in failures
    assert "<td class='sample'>KeyError</td>" in failures
    assert "<td class='sample'>ValueError</td>" in failures
    assert failures.count("cannot score row") == 6  # three samples for each exception type
    metrics = _section(page, "metrics")
    assert "<h4>by region</h4>" in metrics
    table = metrics.split("<h4>by region</h4>")[1]
    head = re.findall(r"<th>([^<]*)</th>", table.split("</tr>")[0])
    assert head[:3] == ["region", "auc_roc", "pr_auc"] and "log_loss" in head
    assert [re.findall(r"<td>([^<]*)</td>", row)[:1] for row in table.split("<tr>")[2:8]] == [
        ["all"],
        ["central"],
        ["east"],
        ["north"],
        ["south"],
        ["west"],
    ]
    plots = _section(page, "plots")
    titles = re.findall(r"<figure data-title='([^']*)'>", plots)
    assert titles == [  # auc_roc and pr_auc over the same (label, score): one set of plots
        "ROC — m/auc_roc",
        "precision-recall — m/auc_roc",
        "scores — m/auc_roc",
        "ROC by region — m/auc_s",
        "precision-recall by region — m/auc_s",
    ]
    sliced = _figure(page, "ROC by region — m/auc_s")
    assert sliced.count("<polyline class='series'") == 5
    assert all(f">{region}</text>" in sliced for region in reports.REGIONS)


def test_rates_are_rows_per_second_over_equal_intervals() -> None:
    timeline = [[0.0, 0], [1.0, 100], [2.0, 100], [3.5, 400], [4.0, 500]]
    assert rates(timeline, points=4) == [[0.5, 100.0], [1.5, 0.0], [2.5, 200.0], [3.5, 200.0]]
    assert rates([[0.0, 0]]) == [] and ticks(-0.04, 0.04)[0] == -0.04


@pytest.mark.timeout(120)
def test_chute_run_prints_where_the_html_report_is(tmp_path: Path) -> None:
    reports.data(tmp_path / "data")
    (tmp_path / "job.yaml").write_text(
        "input: data/\n"
        "models:\n"
        "  - name: m\n"
        "    fn: tests.reports:score\n"
        "    batch_format: numpy\n"
        "    on_error: quarantine\n"
        "output: out/\n"
    )
    result = CliRunner(env={"COLUMNS": "250"}).invoke(main, ["run", str(tmp_path / "job.yaml")])
    assert result.exit_code == 0, result.output
    html = tmp_path / "out" / "_chute" / "report.html"
    assert f"HTML report   │ {html}" in result.output and html.exists()


def test_two_sliced_metrics_that_give_one_value_each_get_their_own_column() -> None:
    """The second auc_roc sliced by the same column was left out of the table."""
    from chute.htmlreport import _sliced

    def sliced(east: float, west: float, log_loss: float) -> dict[str, object]:
        groups = {"east": {"auc_roc": east}, "west": {"auc_roc": west}}
        return {
            "by": "region",
            "all": {"auc_roc": (east + west) / 2, "x": log_loss},
            "groups": groups,
        }

    table = "".join(_sliced([("a", sliced(0.6, 0.8, 1.0)), ("b", sliced(0.7, 0.9, 1.0))]))
    head = re.findall(r"<th>([^<]*)</th>", table.split("</tr>")[0])
    assert head == ["region", "a · auc_roc", "x", "b · auc_roc"]  # the same x: shown once
    assert "0.9" in table and "0.8" in table
