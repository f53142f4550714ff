"""The generated reference pages (docs/invariants.md, docs/options.md) say what the code says.

docs/generate.py writes them from the spec's invariants, the trace formats' and ``kvspec check``'s parser;
a change to any of those without ``.venv/bin/python docs/generate.py`` fails here, and the check is shown
to notice an edited page.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

GENERATOR = Path(__file__).resolve().parent.parent / "docs" / "generate.py"


@pytest.fixture(scope="module")
def generate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvspec_docs_generate", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_generated_pages_are_up_to_date(generate: ModuleType) -> None:
    stale = generate.check()
    assert stale == [], f"{', '.join(map(str, stale))}: stale; run .venv/bin/python docs/generate.py"


def test_the_check_reports_an_edited_page(
    generate: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    written = generate.write(tmp_path)
    assert sorted(p.name for p in written) == ["invariants.md", "options.md"]
    assert generate.check(tmp_path) == []
    assert generate.main(["--check", "--dir", str(tmp_path)]) == 0

    options = tmp_path / "options.md"
    lines = options.read_text(encoding="utf-8").splitlines(keepends=True)
    edited = next(i for i, line in enumerate(lines) if line.startswith("| `--step-timeout`"))
    lines[edited] = lines[edited].replace("`30.0`", "`60.0`")
    options.write_text("".join(lines), encoding="utf-8")

    assert generate.check(tmp_path) == [options]
    capsys.readouterr()
    assert generate.main(["--check", "--dir", str(tmp_path)]) == 1
    assert str(options) in capsys.readouterr().out
    (tmp_path / "invariants.md").unlink()
    assert generate.check(tmp_path) == [tmp_path / "invariants.md", options], "a missing page is stale too"


def test_the_pages_carry_every_invariant_and_flag(generate: ModuleType) -> None:
    from kvspec.spec.invariants import ADAPTER_CONTRACT, INVARIANTS

    pages = generate.pages()
    lines = pages["invariants.md"].splitlines()
    for inv in INVARIANTS:  # once, with its whole first paragraph
        rows = [line for line in lines if line.startswith(f"| `{inv.name}` |") and generate.cell(inv.doc) in line]
        assert len(rows) == 1, inv.name
    assert any(line.startswith(f"| `{ADAPTER_CONTRACT}` |") for line in lines)
    flags = [s for action in generate.check_parser()._actions for s in action.option_strings]
    assert "--full-check-every" in flags and "--mode" in flags  # the run options and the live ones
    for flag in flags:
        assert f"| `{flag}`" in pages["options.md"] or f", `{flag}`" in pages["options.md"], flag
