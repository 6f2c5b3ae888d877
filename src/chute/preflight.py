"""Everything about a job that can be known before compute, checked before anything is
written: ``chute validate`` runs these checks, and every run runs them before it claims
its output (so a job that cannot run leaves no ``_chute/`` behind).

* **code** — every ``fn:`` (models, preprocess) imports and has the attribute it names,
  with "Did you mean …?" over the module's names and the rule for how ``fn:`` resolves;
* **resources** — a replica's CPUs and GPUs fit this machine (a cluster at an address is
  checked by the engine: ``stage_resources`` plans the pools against it);
* **output** — not a file, writable, not owned by a live run, not holding another job.

The schema checks (columns, metric columns, CSV output) are the plan's own
(:func:`chute.plan.build_plan`): a plan exists only for a job that passed them.

A cluster at an address may have packages this machine lacks, so there a ``fn:`` that
does not import here is a warning, not an error.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import pyarrow.fs as pafs

from chute.engines import ENGINES, Engine, choose, local_memory
from chute.engines.resources import check_local
from chute.errors import ConfigError, JobStateError, ResourceError
from chute.job import JobSpec, describe_changes
from chute.job.values import show_bytes
from chute.lease import live_claims
from chute.ledger import Ledger, foreign_error, foreign_files
from chute.plan import Plan
from chute.sinks import EXTENSIONS, output_filesystem
from chute.storage import META_DIR, as_given, check, redact
from chute.tables import TableSink
from chute.usercode import check_callable, import_string

log = logging.getLogger("chute")

FILE_FORMATS = ("parquet", "csv", "jsonl")


def check_job(
    plan: Plan,
    fingerprint: str,
    description: dict[str, Any],
    *,
    engine: Engine | None = None,
    overwrite: bool = False,
) -> list[str]:
    """Run every check; return what was checked, one line each (``chute validate`` prints
    them). ``engine``: also plan its resources (``validate``; a run has prepared it)."""
    job = plan.job
    done = [check_code(job, remote=remote(job))]
    done.append(check_machine(job))
    if engine is not None:
        stages, basis = engine.stage_resources(plan)
        pools = ", ".join(f"{s.name} {s.replicas} replica(s)" for s in stages)
        done.append(f"pools: {pools} ({basis})")
    done.append(check_output(job, fingerprint, description, overwrite))
    if job.output is not None and not isinstance(job.output, TableSink):
        done.append(f"output files of about {job.output.target.describe()} each")
    return [line for line in done if line]


def remote(job: JobSpec) -> bool:
    """Whether the job runs on a cluster at an address (not on this machine): a job that
    asks for the local engine never does, whatever ``RAY_ADDRESS`` says."""
    if ENGINES[choose(job)[0]].requires is None:  # runs in this process
        return False
    return bool(job.address or os.environ.get("RAY_ADDRESS"))


def check_code(job: JobSpec, remote: bool = False) -> str:
    """Import every ``fn:`` the job names by string; fail (or, for a remote cluster, warn)
    naming the model and the fix."""
    targets = [
        (f"model {m.name!r}: fn", m.fn, bool(m.args or m.kwargs))
        for m in job.models
        if isinstance(m.fn, str)
    ]
    if job.preprocess is not None and isinstance(job.preprocess.fn, str):
        targets.append(("preprocess: fn", job.preprocess.fn, False))
    for where, target, constructed in targets:
        try:
            try:
                found = import_string(target)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from exc
            check_callable(f"{where} {target!r}", found, constructed)  # its message names it
        except ConfigError as exc:
            if not remote:
                raise
            log.warning("%s (the cluster may have it; it is not checked here)", exc)
    return f"code imports: {', '.join(t for _, t, _ in targets)}" if targets else ""


def check_machine(job: JobSpec) -> str:
    """On this machine (no cluster address): a replica's CPUs and GPUs must fit it."""
    if remote(job):
        return ""
    cores = os.cpu_count() or 1
    for model in job.models:
        cpus = model.resources.cpus
        if cpus is not None and cpus > cores:
            raise ResourceError(
                f"model {model.name!r} asks for {cpus:g} CPUs per replica but this machine "
                f"has {cores:,}: no replica could ever start. Set resources.cpus to {cores} "
                "or less, or run on a cluster that has such nodes (--address)."
            )
    check_memory(job)
    check_local(list(job.models))
    return f"resources fit this machine ({cores:,} CPUs)"


def check_memory(job: JobSpec) -> None:
    """Replicas' ``resources.memory`` within what the engine offers here: the local
    engine runs them all in this process, so what they ask for together must be on this
    machine (``validate`` said a 500 GiB replica fit a 24 GiB machine); a local Ray offers
    less than the machine has (``validate`` passed what its run then refused)."""
    asked = [(m, m.resources.memory * max(1, m.pool.min)) for m in job.models if m.resources.memory]
    if not asked or remote(job):
        return
    name = choose(job)[0]
    if ENGINES[name].local_memory is None:
        total, where = _machine_memory(), "this machine"
    elif (offer := local_memory(name)) is not None:
        total, where = offer
    else:  # a Ray already running in this process: the engine checks against what it has
        return
    if total is None:
        return
    for model, memory in asked:
        if memory > total:
            each = show_bytes(model.resources.memory or 0)
            raise ResourceError(
                f"model {model.name!r} asks for {show_bytes(memory)} of memory "
                f"({max(1, model.pool.min)} replica(s) of {each}) but {where} has "
                f"{show_bytes(total)}: lower resources.memory or the pool, or run on a "
                "cluster that has the memory (--address)."
            )
    together = sum(memory for _, memory in asked)
    if together > total:
        raise ResourceError(
            f"the models ask for {show_bytes(together)} of memory together but {where} "
            f"has {show_bytes(total)}: lower their resources.memory, or run on a cluster "
            "(--address)."
        )


def _machine_memory() -> int | None:
    """This machine's physical memory in bytes (``None`` where the system does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def check_output(
    job: JobSpec, fingerprint: str, description: dict[str, Any], overwrite: bool = False
) -> str:
    """The output location can take this run: a writable directory (or none yet), that no
    live run owns and that holds no other job's results (unless ``overwrite``)."""
    sink = job.output
    if sink is None or (isinstance(sink, TableSink) and sink.format not in FILE_FORMATS):
        return ""  # none, or a table: its location is resolved (and claimed) by the runner
    if isinstance(sink, TableSink):  # a table's location holds its own files
        return f"output {sink.name}: its claim and schema are checked when it is opened"
    where = redact(sink.path)
    check(sink.path, sink.storage, "output")
    fs, root = output_filesystem(sink.path, sink.storage)
    _check_not_inside(fs, root, where)
    if sink.format not in FILE_FORMATS:  # an OpenAI Batch folder: checked when opened
        return ""
    _check_apart(job, fs, root, EXTENSIONS[sink.format])
    kind = fs.get_file_info(root).type
    if kind == pafs.FileType.File:
        raise JobStateError(
            f"output {where!r} is a file; give a directory (a new or empty one, or one "
            "that holds this job's earlier results)."
        )
    if kind == pafs.FileType.NotFound:
        return f"output {where} is new"
    owners = live_claims(fs, f"{root}/{META_DIR}")
    if owners:
        raise JobStateError(
            f"output {where!r} is in use by another chute run: {owners[0].describe()}. Wait "
            "for it to finish or stop it, or choose another output location."
        )
    claimed = Ledger(fs, root).owner(overwrite) is not None
    foreign = foreign_files(fs, root, claimed)
    if foreign:
        raise JobStateError(foreign_error(where, foreign, claimed))
    if overwrite:
        return f"output {where} will be overwritten (at the run's first commit)"
    return _holds(fs, root, where, fingerprint, description)


def _check_not_inside(fs: pafs.FileSystem, root: str, where: str) -> None:
    """The output is not a folder inside another chute job's output: a reader of that one
    (``pandas.read_parquet``, Spark) reads its folders too, and would take this job's
    rows for its own, ``_SUCCESS`` and all."""
    parents = []
    path = root.rstrip("/")
    while "/" in path.strip("/"):
        path = path.rsplit("/", 1)[0] or "/"
        parents.append(path)
    for parent in parents:
        try:
            kind = fs.get_file_info(f"{parent.rstrip('/')}/{META_DIR}").type
        except OSError:  # a folder this user may not look in (a key policy for one prefix)
            continue
        if kind == pafs.FileType.Directory:
            other = redact(as_given(where, parent))
            raise JobStateError(
                f"output {where!r} is inside the output of another chute job ({other!r}, "
                f"whose {META_DIR}/ is there): a reader of that folder reads the folders in it "
                "too, and would count this job's rows as its own. Choose an output location "
                "outside it."
            )


def _check_apart(job: JobSpec, fs: pafs.FileSystem, root: str, extension: str) -> None:
    """The output and the input do not overlap (:meth:`FileSource.overlaps`)."""
    overlaps = getattr(job.source, "overlaps", None)
    why = overlaps(fs, root, f"part-000000-0000000000-00000000{extension}") if overlaps else None
    if why:
        raise ConfigError(
            f"{why}: a run would read its own output as input, and --overwrite would delete "
            "its input. Write the output outside the input (a folder beside it, or one "
            "whose name starts with '_' inside an input folder)."
        )


def _holds(
    fs: pafs.FileSystem, root: str, where: str, fingerprint: str, description: dict[str, Any]
) -> str:
    """What an existing output directory holds: nothing, this job (a resume), or refused."""
    ledger = Ledger(fs, root)
    owner = ledger.read_json("job.json")
    if owner is None:
        return f"output {where} is empty"
    entries = ledger.read_entries()
    if owner.get("fingerprint") != fingerprint and entries:
        changed = describe_changes(owner.get("job", {}), description)
        raise JobStateError(
            f"output {where!r} holds the results of a different job (changed: {changed}). "
            "Use another output location, or pass --overwrite to discard the earlier results."
        )
    if owner.get("fingerprint") == fingerprint and entries:
        return f"output {where} holds {len(entries):,} committed unit(s) of this job: resumes"
    return f"output {where} is empty"
