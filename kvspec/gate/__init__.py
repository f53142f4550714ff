"""The CI conformance gate: declared once in an engine's repository, known violations as a baseline.

``config`` reads the declaration (``[tool.kvspec]`` or kvspec.toml), ``baseline`` the known
violations and the fingerprint that recognises one again, ``run`` checks every declared
adapter and sorts its violations into new, known and fixed (docs/ci.md).
"""

from .baseline import Baseline, Entry, case_fingerprint, fingerprint
from .config import AdapterRun, GateConfig, GateConfigError
from .run import GateResult, run_gate, write_outputs

__all__ = [
    "AdapterRun",
    "Baseline",
    "Entry",
    "GateConfig",
    "GateConfigError",
    "GateResult",
    "case_fingerprint",
    "fingerprint",
    "run_gate",
    "write_outputs",
]
