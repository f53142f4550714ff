"""``python -m kvspec.cli ...``: the ``kvspec`` command without its console script (``python -m kvspec`` holds
signals back a few imports earlier)."""

from kvspec.console import run

run()
