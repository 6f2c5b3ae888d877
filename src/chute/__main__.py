"""``python -m chute`` is the ``chute`` command."""

from chute.cli import main

main()
