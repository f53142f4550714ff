"""README's worked example, as README says it: the adapter in examples/fifo_adapter.py passes
`kvspec check`, its leaky twin is reported (capacity_conservation), the case replays and is drawn; the
adapter in README is the file's, importing only kvspec.adapter."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest
from clirun import kvspec

from kvspec.dotted import import_object

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def readme_adapter() -> str:
    """The README's adapter block: the python block right after 'Writing an adapter'."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Writing an adapter", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's 'Writing an adapter' has no python block"
    return match.group(1)


def test_the_readme_adapter_is_the_example_s_and_imports_only_kvspec_adapter() -> None:
    source = (EXAMPLES / "fifo_adapter.py").read_text()
    adapter = source[source.index("from fifo_pool") : source.index("\n\n\nclass LeakyFifoPoolAdapter")]
    assert readme_adapter().strip() == adapter.strip()
    code = [line for line in adapter.splitlines() if line.strip()]
    assert len(code) <= 30, len(code)
    imports = [n for n in ast.walk(ast.parse(adapter)) if isinstance(n, ast.Import | ast.ImportFrom)]
    kit = [n.module for n in imports if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("kvspec")]
    assert kit == ["kvspec.adapter"] and len(imports) == 2  # the kit, and the allocator under test


def test_the_worked_example_runs_as_the_readme_says(tmp_path: Path) -> None:
    for name in ("fifo_pool.py", "fifo_adapter.py"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    good = kvspec("check", "--adapter", "fifo_adapter:FifoPoolAdapter", "--profile", "ci", "--quiet", cwd=tmp_path)
    assert good.code == 0, good.err
    bad = kvspec("check", "--adapter", "fifo_adapter:LeakyFifoPoolAdapter", "--profile", "ci", cwd=tmp_path)
    assert bad.code == 1 and "VIOLATED capacity_conservation" in bad.out, bad.out + bad.err
    (case,) = (tmp_path / ".kvspec" / "cases").glob("*capacity_conservation*.json")
    replay = kvspec("replay", str(case), "--adapter", "fifo_adapter:LeakyFifoPoolAdapter", cwd=tmp_path)
    assert replay.code == 1 and "capacity_conservation: free" in replay.out, replay.out + replay.err
    drawn = kvspec(
        "show", str(case), "--adapter", "fifo_adapter:LeakyFifoPoolAdapter", "--out", "case.svg", cwd=tmp_path
    )
    assert (
        drawn.code == 0
        and "capacity_conservation" in drawn.out
        and (tmp_path / "case.svg").read_text().startswith("<svg")
    ), drawn.err


def test_an_adapter_module_in_the_working_directory_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As `kvspec` (a console script, whose sys.path has no working directory) would: the module is looked for in
    the working directory after everything installed; a name importable nowhere still fails in one line."""
    (tmp_path / "kvspec_cwd_probe.py").write_text("class Probe:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    assert import_object("kvspec_cwd_probe:Probe").__name__ == "Probe"  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="cannot import 'kvspec_no_such_module'"):
        import_object("kvspec_no_such_module:X")
