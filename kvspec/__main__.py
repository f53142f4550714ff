"""``python -m kvspec ...``: the ``kvspec`` command (kvspec.console), signals held from its first instruction."""

from kvspec.console import run

run()
