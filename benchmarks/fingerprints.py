"""How stable the gate's fingerprint is: the same seeded bug, found from different seeds, fingerprinted.

For each bug of tests/seeded_bugs.py, run the suite with seeds 1..N (the thorough
profile's random search, shrunk and minimised as a real run is) and count the distinct fingerprints
of the reported cases. One fingerprint per bug means a baseline entry recognises that bug whatever
the seed. Prints a table; --json writes the figures.

    python benchmarks/fingerprints.py --seeds 5
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import seeded_bugs

from kvspec.case import Case
from kvspec.gate import case_fingerprint
from kvspec.stateful_tests import PROFILES, Options, run_check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--max-examples", type=int, default=300)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    bugs = seeded_bugs.SEEDED_BUGS
    print(f"{'bug':<28} {'invariant':<28} {'found':>5} {'distinct':>8}  fingerprints")
    for bug in bugs:
        prints: Counter[str] = Counter()
        invariants: Counter[str] = Counter()
        with tempfile.TemporaryDirectory() as cases:
            for seed in range(1, args.seeds + 1):
                result = run_check(
                    bug.factory,
                    bug.name,
                    Options(
                        profile=PROFILES["thorough"], seed=seed, max_examples=args.max_examples, cases_dir=Path(cases)
                    ),
                )
                if result.failure is None or not result.cases:
                    continue
                case = Case.load(Path(result.cases[-1]))
                prints[case_fingerprint(case)] += 1
                invariants[str(case.expected.get("invariant"))] += 1
        found = sum(prints.values())
        rows.append({"bug": bug.name, "invariants": dict(invariants), "found": found, "distinct": len(prints)})
        top = ", ".join(f"{p[:6]}x{n}" for p, n in prints.most_common())
        print(f"{bug.name:<28} {'/'.join(invariants):<28} {found:>5} {len(prints):>8}  {top}", flush=True)
    stable = sum(r["distinct"] == 1 for r in rows if r["found"])
    print(f"\n{stable} of {sum(1 for r in rows if r['found'])} bugs: one fingerprint over {args.seeds} seeds")
    if args.json is not None:
        args.json.write_text(json.dumps({"seeds": args.seeds, "bugs": rows}, indent=1))


if __name__ == "__main__":
    main()
