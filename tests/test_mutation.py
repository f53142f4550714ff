"""The mutation benchmark's mutator (benchmarks/mutation.py): every mutant is a real change, each one
applies in a fresh process through the import system, and the mutated module's file is never written.

The module mutated here is a small package written to tmp_path, so the test needs no vLLM (the
benchmark's --quick run in CI does the same against vLLM's allocator).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

POOL = '''
class Pool:
    """A toy free list: enough for every operator the mutator knows."""

    def __init__(self, n):
        self.free = list(range(0, n))
        self.used = 0

    def take(self, k):
        if k > len(self.free):
            return None
        got, self.free = self.free[:k], self.free[k:]
        self.used += k
        return got

    def full(self):
        return len(self.free) == 0 and self.used >= 1


def helper(a, b):  # outside the mutated classes: never changed
    return a - b
'''


def load_mutation() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "mutation.py"
    spec = importlib.util.spec_from_file_location("kvspec_bench_mutation", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def mutation(tmp_path: Path) -> ModuleType:
    module = load_mutation()
    module.CACHE = tmp_path / "cache"  # the sitecustomize goes here, not to ~/.cache
    return module


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    package = tmp_path / "toypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "pool.py").write_text(POOL)
    return package / "pool.py"


def test_every_mutant_changes_the_code(mutation: ModuleType, toy: Path) -> None:
    source = toy.read_text()
    found = mutation.mutants("toypkg.pool", ("Pool",), source)
    operators = {m.operator for m in found}
    assert {"compare", "arithmetic", "boolean", "off-by-one", "negate", "remove", "swap-args"} <= operators
    original = ast.unparse(ast.parse(source))
    for m in found:
        tree, _ = mutation.mutate(source, ("Pool",), m.index)
        assert ast.unparse(tree) != original, m
        assert "return a - b" in ast.unparse(tree)  # helper is outside the mutated class
    assert len({m.index for m in found}) == len(found)


def run_child(mutation: ModuleType, plan: Path | None, toy: Path, code: str) -> str:
    env = mutation.mutant_env(plan, toy.parent.parent)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_mutant_applies_in_a_fresh_process_and_leaves_the_file(
    mutation: ModuleType, toy: Path, tmp_path: Path
) -> None:
    digest, mtime = hashlib.sha256(toy.read_bytes()).hexdigest(), toy.stat().st_mtime_ns
    found = mutation.mutants("toypkg.pool", ("Pool",), toy.read_text())
    compare = next(m for m in found if m.operator == "compare" and m.before.startswith("k > len"))
    probe = "import toypkg.pool as p; print(getattr(p, '__kvspec_mutant__', None), p.Pool(2).take(3))"
    assert run_child(mutation, None, toy, probe) == "None None"  # no plan: the module as written
    plan = mutation.plan_file(compare, ("Pool",), toy, tmp_path)
    # k >= len(free): taking exactly what is free is refused; taking more still is
    assert run_child(mutation, plan, toy, probe) == f"{compare.index} None"
    exact = "import toypkg.pool as p; print(p.Pool(2).take(2))"
    assert run_child(mutation, None, toy, exact) == "[0, 1]"
    assert run_child(mutation, plan, toy, exact) == "None"
    assert hashlib.sha256(toy.read_bytes()).hexdigest() == digest
    assert toy.stat().st_mtime_ns == mtime
    assert not list(toy.parent.glob("*.pyc")) and not (toy.parent / "__pycache__" / "pool.mutant").exists()


def test_a_mutant_of_a_changed_file_refuses_to_load(mutation: ModuleType, toy: Path, tmp_path: Path) -> None:
    found = mutation.mutants("toypkg.pool", ("Pool",), toy.read_text())
    plan = mutation.plan_file(found[0], ("Pool",), toy, tmp_path)
    toy.write_text(POOL + "\n# edited\n")
    env = mutation.mutant_env(plan, toy.parent.parent)
    out = subprocess.run([sys.executable, "-c", "import toypkg.pool"], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "is not the file the mutant was made from" in out.stderr
