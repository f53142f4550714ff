"""A command in a fresh child process (``kvspec ...`` or a module's ``main``), measured: exit code, CPU, peak RSS.

The benchmarks that report memory run each command in its own process so its peak is its own. The
child prints that peak on stderr: its address space's high-water mark (``VmHWM`` in
/proc/self/status). Not ``ru_maxrss``: Linux carries it over fork and exec, so a child of a parent
holding 300 MB reports 313 MB whatever it does itself (``RUSAGE_CHILDREN``'s is, besides, the largest
of every child so far); ``ru_maxrss`` only where /proc is missing.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ChildRun:
    """What one child run cost; ``cpu_s`` is user + system time of the child alone."""

    exit_code: int
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    stdout: str = ""


_PEAK_KB = (
    "next((int(line.split()[1]) for line in open('/proc/self/status') if line.startswith('VmHWM:')), 0) "
    "if __import__('os').path.exists('/proc/self/status') else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss"
)
"""The child's expression of its own peak resident set in kB (see the module's docstring)."""


def main_in_child(module: str, argv: list[str], path: Path | None = None) -> ChildRun:
    """Run ``module.main(argv)`` (a function returning an exit code) in a fresh Python child of this interpreter.

    ``path``: a folder the child imports ``module`` from (a benchmark script's), ahead of its ``sys.path``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    code = (
        "import resource, sys\n"
        + ("" if path is None else f"sys.path.insert(0, {str(path)!r})\n")
        + f"from {module} import main\n"
        f"code = main({argv!r})\n"
        f"print('peak_rss_kb', {_PEAK_KB}, file=sys.stderr)\nsys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    peak_kb = next((int(w[1]) for w in (ln.split() for ln in done.stderr.splitlines()) if w[:1] == ["peak_rss_kb"]), 0)
    return ChildRun(done.returncode, wall, cpu, peak_kb / 1024, done.stdout)


def kvspec_in_child(argv: list[str]) -> ChildRun:
    """Run ``kvspec ARGV`` (the CLI's ``main``) in a fresh Python child of this interpreter."""
    return main_in_child("kvspec.cli", argv)


__all__ = ["ChildRun", "kvspec_in_child", "main_in_child"]
