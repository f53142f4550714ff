"""One ``kvspec`` command in a fresh child process, measured: exit code, wall and CPU seconds, peak RSS.

The benchmarks that report memory run each command in its own process so its peak is its own
(``RUSAGE_CHILDREN``'s ``ru_maxrss`` is the largest of every child so far, so the child prints its
own ``RUSAGE_SELF`` peak on stderr).
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class ChildRun:
    """What one child run cost; ``cpu_s`` is user + system time of the child alone."""

    exit_code: int
    wall_s: float
    cpu_s: float
    peak_rss_mb: float


def kvspec_in_child(argv: list[str]) -> ChildRun:
    """Run ``kvspec ARGV`` (the CLI's ``main``) in a fresh Python child of this interpreter."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    code = (
        "import resource, sys\nfrom kvspec.cli import main\n"
        f"code = main({argv!r})\n"
        "print('peak_rss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\nsys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    peak_kb = next((int(w[1]) for w in (ln.split() for ln in done.stderr.splitlines()) if w[:1] == ["peak_rss_kb"]), 0)
    return ChildRun(done.returncode, wall, cpu, peak_kb / 1024)


__all__ = ["ChildRun", "kvspec_in_child"]
