"""The driver: plan, skip what is done, hand the plan to an engine, commit what comes back.

The driver sees only :class:`~chute.sinks.PartRecord` rows — never row data, unless the
caller asked for the result in memory.

- :mod:`~chute.runner.run`: :func:`run_job`, one run from the job to its report;
- :mod:`~chute.runner.committer`: :class:`Committer`, units committed as their parts arrive;
- :mod:`~chute.runner.reporting`: the report a run writes.
"""

from chute.runner.committer import Committer
from chute.runner.run import run_job

__all__ = ["Committer", "run_job"]
