"""``chute run JOB -q`` with the driver killed (SIGKILL, by itself) around a table commit.

    python tests/table_chaos.py POINT N JOB

POINT is where the N-th commit batch dies:

* ``staged`` — its units are in chute's ledger (staged), the table has not seen them;
* ``committed`` — the table transaction landed, chute's confirmation is not written.

Anything else runs the job untouched. The kill is injected by wrapping
:meth:`chute.tableledger.TableLedger._add` here, in the test's driver; chute has no hook.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from chute.tableledger import TableLedger


def _inject(point: str, n: int) -> None:
    add = TableLedger._add
    count = 0

    def killing(self: TableLedger, *args: Any) -> None:
        nonlocal count
        count += 1
        if point == "staged" and count == n:
            os.kill(os.getpid(), signal.SIGKILL)
        add(self, *args)
        if point == "committed" and count == n:
            os.kill(os.getpid(), signal.SIGKILL)

    TableLedger._add = killing  # type: ignore[method-assign]


if __name__ == "__main__":
    _inject(sys.argv[1], int(sys.argv[2]))
    from chute.cli import main

    main(["run", sys.argv[3], "-q"])
