"""CI: a keep-going check whose findings are documented must report exactly those (exit 1), never 0 or 2.

usage: python .ci/documented.py [--at-most] CODE REPORT NAME [NAME ...]
--at-most: a search that may or may not meet the documented findings: it passes (exit 0) or reports only
documented ones (exit 1); anything else, or exit 2, fails.
"""

import json
import sys
from pathlib import Path

args = sys.argv[1:]
at_most = args[:1] == ["--at-most"]
if at_most:
    args = args[1:]
code, report, documented = int(args[0]), json.loads(Path(args[1]).read_text()), set(args[2:])
violated = {r["name"] for r in report["invariants"] if r["verdict"] == "violated"}
if at_most:
    ok = (code == 0 and not violated) or (code == 1 and violated <= documented)
else:
    ok = code == 1 and violated == documented
if not ok:
    sys.exit(f"{report['adapter']}: exit {code}, violated {sorted(violated)}, documented {sorted(documented)}")
print(f"{report['adapter']}: documented findings only: {sorted(violated)}")
