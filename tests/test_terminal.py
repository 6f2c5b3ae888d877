"""What a person reads in a terminal or a CI log: folded names, thousands separators,
progress lines when the output is not a terminal, one throughput figure, ``--help``."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from chute.cli import main
from chute.demo import generate
from chute.report import ProgressBar, RateColumn
from chute.terminal import Folded, ProgressLines, fold

BOUNDARY = "/.:_-, "


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("text", "width", "lines"),
    [
        pytest.param("chute.demo:tip_model", 12, ["chute.demo:", "tip_model"], id="dotted"),
        pytest.param("chute.demo:tip_model", 8, ["chute.", "demo:", "tip_", "model"], id="narrow"),
        pytest.param(
            "/data/taxi/yellow_2009-01.parquet",
            16,
            ["/data/taxi/", "yellow_2009-01.", "parquet"],
            id="path",
        ),
        pytest.param("no start-up cost", 10, ["no", "start-up", "cost"], id="words-first"),
        pytest.param("abcdefghij", 4, ["abcd", "efgh", "ij"], id="too-long-cut"),
    ],
)
def test_fold_breaks_at_boundaries(text: str, width: int, lines: list[str]) -> None:
    assert fold(text, width) == lines


def test_a_folded_cell_never_breaks_a_word() -> None:
    """At 80 columns a long model name and path fold at their boundaries (the issue saw
    ``chute.d/emo:tip/_model``)."""
    table = Table(show_header=False)
    table.add_column()
    table.add_column()
    path = "/home/someone/projects/chute-demo/taxi/yellow_2009-01.parquet"
    table.add_row(Folded("chute.demo:tip_model"), Folded(path))
    console = Console(width=40, record=True, file=io.StringIO())
    console.print(table)
    cells = [line.split("│")[1:3] for line in console.export_text().splitlines() if "│" in line]
    for column, whole in ((0, "chute.demo:tip_model"), (1, path)):
        parts = [c[column].strip() for c in cells if c[column].strip()]
        assert "".join(parts) == whole
        assert all(p[-1] in BOUNDARY for p in parts[:-1]), parts


def test_progress_lines_for_a_log() -> None:
    clock, out = Clock(), io.StringIO()
    lines = ProgressLines(2_000_000, Console(file=out, width=200), clock, every=5.0)
    lines.start()
    lines.advance(100_000)  # t=0: not yet
    clock.now = 5.0
    lines.describe("units 1/12")
    clock.now = 6.0
    lines.advance(400_000)  # 1 s after the last line: not yet
    clock.now = 10.0
    lines.advance(500_000)
    clock.now = 12.5
    lines.finish()
    assert out.getvalue().splitlines() == [
        "units 1/12 · 100,000 of 2,000,000 rows (5%) · 20,000 rows/s · ETA 1 min 35 s · "
        "5 s elapsed",
        "units 1/12 · 1,000,000 of 2,000,000 rows (50%) · 100,000 rows/s · ETA 10 s · 10 s elapsed",
        "units 1/12 · 1,000,000 of 2,000,000 rows (50%) · 12 s elapsed",  # no second rate
    ]


@pytest.mark.timeout(30)
def test_a_bar_on_a_non_terminal_prints_lines() -> None:
    out = io.StringIO()
    console = Console(file=out, width=200)
    assert not console.is_terminal
    with ProgressBar(1_000_000, console=console, every=0.0) as bar:
        bar.advance(250_000)
    text = out.getvalue()
    assert "250,000 of 1,000,000 rows (25%)" in text
    assert "━" not in text  # no bar drawn into a log


def test_a_bar_on_a_terminal_has_thousands_separators() -> None:
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=True)
    clock = Clock()
    with ProgressBar(2_000_000, console=console, clock=clock) as bar:
        clock.now = 2.0
        bar.advance(1_234_567)
    assert "1,234,567/2,000,000" in out.getvalue()


def test_the_bar_leaves_the_final_throughput_to_the_report() -> None:
    progress = Progress(get_time=lambda: 2.0)
    task = progress.add_task("units", total=10)
    progress.update(task, completed=5)
    column = RateColumn()
    assert "rows/s" in column.render(progress.tasks[0]).plain
    progress.update(task, completed=10)
    assert column.render(progress.tasks[0]).plain == ""


def test_help_shows_whole_descriptions_and_examples() -> None:
    result = CliRunner(env={"COLUMNS": "80"}).invoke(main, ["--help"])
    assert result.exit_code == 0
    text = result.output
    commands = text[text.index("Commands:") : text.index("Examples:")]
    assert "..." not in commands  # click cuts a description at 45 characters with "..."
    flat = " ".join(text.split())
    assert (
        "validate Check JOB_FILE before any compute: keys, columns, code, resources and "
        "output; run nothing." in flat
    )
    assert "Examples:" in text
    for name in main.list_commands(None):  # type: ignore[arg-type]
        command = main.get_command(None, name)  # type: ignore[arg-type]
        example = getattr(command, "example", None)
        assert example, f"give `chute {name}` an example: @main.command(example='chute {name} …')"
        assert " ".join(example.split()) in flat
        sub = CliRunner(env={"COLUMNS": "80"}).invoke(main, [name, "--help"])
        assert "Example:" in sub.output and example.split()[0] in sub.output


@pytest.fixture(scope="module")
def taxi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("terminal-data") / "taxi"
    generate(str(data), total=1_200)
    return data


@pytest.mark.timeout(60)
def test_plan_explains_capped_pools_and_oversized_resources(tmp_path: Path, taxi: Path) -> None:
    cores = os.cpu_count() or 1
    job = tmp_path / "job.yaml"
    job.write_text(
        f"input: {{path: {taxi}, format: parquet}}\n"
        "models:\n"
        "  - {name: tip, fn: chute.demo:tip_model, inputs: [passenger_count],\n"
        f"     pool: {{min: 1, max: {cores + 4}}}}}\n"
        f"  - {{name: big, fn: chute.demo:tip_model, inputs: [passenger_count],\n"
        f"     resources: {{cpus: {cores + 1}}}}}\n"
        f"output: {tmp_path / 'out'}\n"
    )
    result = CliRunner(env={"COLUMNS": "80"}).invoke(main, ["plan", str(job)])
    # the table's borders out: a cell that wraps (a longer temporary path) is one text
    flat = " ".join(result.output.translate({ord(c): " " for c in "│┌┐└┘├┤┬┴┼─"}).split())
    assert result.exit_code == 0, flat
    assert (
        f"tip: pool capped at {cores:,} of the 1–{cores + 4:,} asked: this machine has "
        f"{cores:,} CPU(s) and each replica takes 1"
    ) in flat
    assert f"big: will not run: model 'big' asks for {cores + 1} CPUs per replica" in flat
    assert "chute.demo:tip_model" in result.output  # whole at 80 columns
    assert "1,200 rows" in flat
