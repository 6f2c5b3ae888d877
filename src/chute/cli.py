"""The ``chute`` command line. Commands parse their options and delegate; errors become a
message and the exit code of their :class:`~chute.errors.ChuteError` class."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from chute import engines
from chute.api import Job
from chute.errors import ChuteError, ConfigError, JobStateError
from chute.job import Pool
from chute.report import Report

F = TypeVar("F", bound=Callable[..., Any])
INTERRUPTED = 130

console = Console()
errors = Console(stderr=True)


def handle_errors(fn: F) -> F:
    """Turn chute errors into a one-paragraph message and their exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ChuteError as exc:
            # escaped: "pip install 'chute[onnx]'" is not rich markup
            errors.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            # only `chute run` has committed units to keep (`demo` starts over each time)
            again = (
                " Committed units are kept in the output's ledger; run the same command again "
                "to resume."
                if fn.__name__ == "run"
                else ""
            )
            errors.print(f"[bold yellow]interrupted.[/]{again}")
            sys.exit(INTERRUPTED)

    return wrapper  # type: ignore[return-value]


class Command(click.Command):
    """A command whose one-line description is never cut short, with an example:
    ``@main.command(example="chute run job.yaml")``."""

    def __init__(self, *args: Any, example: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.example = example

    def get_short_help_str(self, limit: int = 45) -> str:
        """The first sentence of the help, whole (click cuts it at ``limit`` with "...")."""
        if self.short_help:
            return self.short_help
        first = (self.help or "").strip().split("\n\n")[0]
        return " ".join(first.split())

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        if self.example:
            with formatter.section("Example"):
                formatter.write_text(self.example)


class Group(click.Group):
    """``chute --help``: every command's whole description, then an example of each."""

    command_class = Command

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            example = getattr(cmd, "example", None)
            if cmd is not None and not cmd.hidden and example:
                rows.append((name, example))
        if rows:
            with formatter.section("Examples"):
                formatter.write_dl(rows)
        super().format_epilog(ctx, formatter)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="chute")
def main() -> None:
    """chute: offline batch inference, streaming and resumable, in one process or on Ray."""


def job_options(fn: F) -> F:
    """The overrides every job command accepts."""
    options = [
        click.option(
            "--input", "input_path", help="Replace the job's input path or glob (from here)."
        ),
        click.option(
            "--output", "output_path", help="Replace the job's output location (from here)."
        ),
        click.option("--batch-size", help="Batch size for every model: rows, or a size like 8MiB."),
        click.option("--pool", type=click.IntRange(min=1), help="Fixed pool size for every model."),
        click.option(
            "--engine", type=click.Choice([engines.AUTO, *engines.names()]), help="Engine to use."
        ),
        click.option("--address", envvar="RAY_ADDRESS", help="Ray cluster address (implies ray)."),
        click.option(
            "--trust-pickle",
            is_flag=True,
            help="Load pickle/joblib model files: they run code from the file, so only yours.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _from_here(path: str | None) -> str | None:
    if path is None or "://" in path:
        return path
    from chute.storage import local_absolute

    return local_absolute(path)


def _load(job_file: str, **opts: Any) -> Job:
    from chute.config import load_job

    pool = opts.get("pool")
    return load_job(
        job_file,
        # paths typed on the command line are the shell's: from the current directory
        # (the job file's own paths are from its folder)
        input=_from_here(opts.get("input_path")),
        output=_from_here(opts.get("output_path")),
        batch_size=opts.get("batch_size"),
        pool=Pool.fixed(pool) if pool else None,
        engine=opts.get("engine"),
        address=opts.get("address"),
        trust_pickle=opts.get("trust_pickle") or None,
    )


@main.command(example="chute run job.yaml  (again: resumes; --limit 20 tries 20 rows)")
@click.argument("job_file", type=click.Path(dir_okay=False))
@job_options
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    help="Try the job on its first N rows and print a few output rows; nothing is written.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help=(
        "Replace the earlier results in the output (deleted at this run's first commit). "
        "A table's rows are never deleted: there it adds this job's rows even where the "
        "table holds another job's rows of the same input (they are then in it twice), "
        "leaving an unfinished job unfinished."
    ),
)
@click.option("-v", "--verbose", is_flag=True, help="Show Ray's own progress bars and logs.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@handle_errors
def run(
    job_file: str, limit: int | None, overwrite: bool, verbose: bool, quiet: bool, **opts: Any
) -> None:
    """Run the job in JOB_FILE (YAML), resuming if its output holds part of it."""
    job = _load(job_file, **opts)
    report = job.run(progress=not quiet, overwrite=overwrite, verbose=verbose, limit=limit)
    if limit is not None:
        _print_sample(report, limit)
        return
    console.print(report)
    failed = report.metric_errors
    if failed:  # the output is finished; a CI that reads the exit code must still see it
        errors.print(
            f"[bold red]error:[/] {len(failed)} metric(s) could not compute their results "
            f"({escape('; '.join(failed))}). The output is complete: only the metric values "
            "are missing. A fixed metric makes another job: run it to another output, or with "
            "--overwrite (which computes the output again; see its help for a table).",
            highlight=False,
        )
        sys.exit(ChuteError.exit_code)


def _print_sample(report: Report, limit: int) -> None:
    result = report.result
    if result is None:
        return
    sample = result.slice(0, 5).to_pylist()
    failed = f", {report.rows_failed:,} failed" if report.rows_failed else ""
    table = Table(
        title=f"first rows of {result.num_rows:,}{failed} (--limit {limit}; nothing written)"
    )
    for name in result.column_names:
        table.add_column(name)
    for row in sample:
        table.add_row(*(str(v) for v in row.values()))
    console.print(table)
    if report.rows_failed:  # quarantined, and --limit writes no errors dataset to look in
        console.print(
            f"{report.rows_failed:,} of the rows tried failed (set aside by on_error: "
            "quarantine or on_bad_input: skip): they are not among these. A run without "
            "--limit writes them, with why, to _errors/."
        )
    console.print("Run without --limit for the full job.")


@main.command(example="chute validate job.yaml")
@click.argument("job_file", type=click.Path(dir_okay=False))
@job_options
@click.option("--overwrite", is_flag=True, help="Check as for a run with --overwrite.")
@handle_errors
def validate(job_file: str, overwrite: bool, **opts: Any) -> None:
    """Check JOB_FILE before any compute: keys, columns, code, resources and output; run
    nothing.

    Everything a run checks before it writes: the keys and values, every column against
    the data's schema, that each fn: imports, that resources fit the machine (or the
    cluster at --address), and that the output can take the run."""
    from chute.planview import validate_job

    for line in validate_job(_load(job_file, **opts), overwrite=overwrite):
        console.print(f"  {escape(line)}", highlight=False)
    console.print(f"[green]ok[/]: {escape(job_file)} is valid.", highlight=False)


@main.command(example="chute plan job.yaml --address HEAD_IP:6379")
@click.argument("job_file", type=click.Path(dir_okay=False))
@job_options
@handle_errors
def plan(job_file: str, **opts: Any) -> None:
    """Show what the job would run: units, rows, stages, resources, pools; run nothing."""
    from chute.planview import render_plan

    console.print(render_plan(_load(job_file, **opts)))


JOB_OPTION = click.option(
    "--job", help="Of a table's jobs, this one (its fingerprint's first digits)."
)


@main.command(example="chute status out/tips/  (or the job file: chute status job.yaml)")
@click.argument("output")
@JOB_OPTION
@handle_errors
def status(output: str, job: str | None) -> None:
    """Show what an output location (or a job file's) holds: units done, rows, finished.

    OUTPUT is a directory, a table's location (each of its jobs), or a job file."""
    from chute.planview import render_status

    console.print(render_status(*_location(output, job)))


@main.command(example="chute report out/tips/")
@click.argument("output")
@JOB_OPTION
@handle_errors
def report(output: str, job: str | None) -> None:
    """Print the report of a finished or partial run again and (re)write its HTML.

    OUTPUT is the output location (a table's: its latest job's report), or the job file
    (its storage options included)."""
    from chute.planview import rewrite_report

    summary, html_path = rewrite_report(*_location(output, job))
    console.print(summary)
    console.print(f"HTML report: {html_path}")


def _location(
    output: str, job: str | None = None
) -> tuple[str, Any, str | None, dict[str, Any] | None]:
    """An output location, how to reach it, which job of a table, and the job file's
    description (to tell whether the output holds that job): given directly, or as a job
    file's output (with the job's ``storage:`` section, say an S3 endpoint)."""
    is_job_file = output.endswith((".yaml", ".yml"))
    if is_job_file and not os.path.exists(output):
        raise ConfigError(f"the job file {output!r} does not exist.")
    if "://" not in output and not os.path.exists(output) and not is_job_file:
        raise JobStateError(
            f"{output!r} does not exist: give the output location of a run (the job's "
            "output: path), or its job file."
        )
    if not (is_job_file and os.path.isfile(output)):
        return output, None, job, None
    from chute.planview import output_of

    loaded = _load(output)
    path, storage, own = output_of(loaded)
    try:  # the input lists its files: gone, or out of reach, there is nothing to compare
        description: dict[str, Any] | None = loaded.describe()
    except ChuteError:
        description = None
    return path, storage, job or own, description


@main.command(example="chute demo --rows 100000")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False),
    default="chute-demo",
    show_default=True,
    help="Where the generated data and the results go.",
)
@click.option(
    "--rows",
    type=click.IntRange(min=12),
    default=None,
    help="Rows to generate (default: 1,710,629, as in the 2009 taxi sample).",
)
@click.option("--engine", type=click.Choice([engines.AUTO, *engines.names()]), default="auto")
@click.option("-v", "--verbose", is_flag=True, help="Show Ray's own progress bars and logs.")
@handle_errors
def demo(directory: str, rows: int | None, engine: str, verbose: bool) -> None:
    """Generate a synthetic NYC-taxi dataset and run the tip model over it."""
    from chute.demo import TOTAL_ROWS, demo_job

    total = rows or TOTAL_ROWS
    console.print(f"Generating {total:,} taxi trips in {os.path.join(directory, 'taxi')} ...")
    job = demo_job(directory, engine=engine, rows=total)
    report = job.run(progress=True, overwrite=True, verbose=verbose)
    console.print(report)
    assert job.output is not None
    report_html = os.path.join(job.output.path, "_chute", "report.html")
    console.print(f"Results: {job.output.path}  (open the report: {report_html})")


@main.command(
    "run-batch", example="chute run-batch -i requests.jsonl -o results.jsonl --model ./qwen"
)
@click.option("-i", "--input-file", required=True, help="OpenAI Batch requests (JSON Lines).")
@click.option(
    "-o", "--output-file", required=True, help="A file (written whole at the end) or a folder/."
)
@click.option("--model", required=True, help="The local model directory.")
@click.option("--seed", type=int, help="Job seed: each request's seed comes from it and its id.")
@click.option("--max-model-len", type=int, help="The model's window, in tokens.")
@click.option("--dtype", help="Weights' dtype for vLLM (auto, bfloat16, float16, ...).")
@click.option("--enforce-eager", is_flag=True, default=None, help="No CUDA graphs.")
@click.option("--served-model-name", help="The `model` the answers name.")
@click.option(
    "--task",
    type=click.Choice(["generate", "embed"]),
    help="generate (chat and completions) or embed (/v1/embeddings, vLLM's pooling runner); "
    "default: embed when every request is /v1/embeddings.",
)
@click.option("--requests-per-unit", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), help="Requests per engine call.")
@click.option("--engine", default="auto", help="Engine to use.")
@click.option("--overwrite", is_flag=True, help="Discard what an earlier run committed.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@handle_errors
def run_batch(overwrite: bool, quiet: bool, **flags: Any) -> None:
    """Answer every request of an OpenAI Batch file with vLLM, resumably (like vllm run-batch)."""
    from chute.runbatch import from_flags, run_batch

    console.print(run_batch(from_flags(**flags), progress=not quiet, overwrite=overwrite))
