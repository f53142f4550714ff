"""The pytest plugin runs the conformance suite inside another repo, and the registry finds adapters."""

from __future__ import annotations

import pytest

from kvspec.adapters import AdapterLoadError, available, load
from kvspec.adapters.reference_paged import ReferencePagedAdapter

BUGGY_MODULE = """
from kvspec.adapters.reference_paged import ReferencePagedAdapter
from kvspec.reference.paged import PagedPrefixCache

class LeakyPool(PagedPrefixCache):
    def free(self, req_id, *, keep_cached=True):
        blocks = self.req_blocks.get(req_id, [])
        if len(blocks) > 1:
            blocks[-1].ref_cnt += 1  # the tail block never comes back
        super().free(req_id, keep_cached=keep_cached)

def Factory():
    return ReferencePagedAdapter(lambda c: LeakyPool(c.capacity, c.block_size))
"""


def test_plugin_passes_a_correct_adapter(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    result = pytester.runpytest("--kvspec-adapter=reference", "--kvspec-max-examples=20")
    result.assert_outcomes(passed=2)


def test_plugin_fails_a_buggy_adapter_with_the_table(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(myalloc=BUGGY_MODULE)
    result = pytester.runpytest("--kvspec-adapter=myalloc:Factory", "--kvspec-max-examples=100")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*VIOLATED ref_count_matches_references*", "*case saved:*"])


def test_plugin_rejects_an_unknown_adapter_as_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--kvspec-adapter=nothing-here")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown adapter 'nothing-here'*"])


def test_kvspec_check_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        myalloc=BUGGY_MODULE,
        test_mine="""
def test_reference_conforms(kvspec_check):
    result = kvspec_check("reference")
    assert result.status == "passed"

def test_mine_conforms(kvspec_check):
    from myalloc import Factory
    kvspec_check(Factory)
""",
    )
    result = pytester.runpytest("--kvspec-max-examples=100", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)


def test_registry_by_name_path_and_errors() -> None:
    assert load("reference") is ReferencePagedAdapter
    assert load("kvspec.adapters.reference_paged:ReferencePagedAdapter") is ReferencePagedAdapter
    assert {"reference", "lifecycle-sim", "scheduler-sim"} <= set(available())
    for bad in ("nope", "kvspec.adapters.reference_paged:Nope", "no.such.module:X", "kvspec.spec:INVARIANT_NAMES"):
        with pytest.raises(AdapterLoadError):
            load(bad)


def test_registry_finds_a_third_party_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    import kvspec.adapters as registry

    fake = EntryPoint("their-engine", "kvspec.adapters.reference_paged:ReferencePagedAdapter", "kvspec.adapters")
    monkeypatch.setattr(registry, "entry_points", lambda group: [fake] if group == "kvspec.adapters" else [])
    assert "their-engine" in registry.available()
    assert registry.load("their-engine") is ReferencePagedAdapter


def test_plugin_full_check_every_reaches_the_run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--kvspec-full-check-every K`` is the run's K (the report says so, and whole-state checks ran every K
    steps); without it the profile's K (1) holds; a K below 1 is a usage error."""
    pytester.makepyfile(
        test_k="""
import os

def test_k(kvspec_check):
    report = kvspec_check("reference").to_json()
    want = int(os.environ["WANT_K"])
    assert report["full_check_every"] == want, report["full_check_every"]
    assert (report["full_checks"] > 0) == (want > 1), report["full_checks"]
""",
    )
    for flags, want in (([], "1"), (["--kvspec-full-check-every=6"], "6")):
        monkeypatch.setenv("WANT_K", want)
        result = pytester.runpytest("--kvspec-max-examples=10", *flags)
        result.assert_outcomes(passed=1)
    result = pytester.runpytest("--kvspec-full-check-every=0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kvspec-full-check-every*at least 1*"])


@pytest.mark.slow
def test_plugin_writes_a_failing_check_as_a_page(pytester: pytest.Pytester) -> None:
    """``--kvspec-html DIR``: the failing item's run as DIR/<adapter>.html with its case drawn, and the fixture's
    failing check as DIR/<test id>.html; a passing check writes nothing."""
    pytester.makepyfile(
        myalloc=BUGGY_MODULE,
        test_mine="""
def test_reference_conforms(kvspec_check):
    kvspec_check("reference")

def test_mine_conforms(kvspec_check):
    from myalloc import Factory
    kvspec_check(Factory)
""",
    )
    pages = pytester.path / "pages"
    args = ["--kvspec-adapter=myalloc:Factory", "--kvspec-max-examples=100", "-p", "no:randomly"]
    # In a subprocess: drawing imports numpy and matplotlib, and an in-process run would unload them after it
    # (pytester restores sys.modules), which numpy does not survive in the tests that run next.
    result = pytester.runpytest_subprocess(*args, f"--kvspec-html={pages}")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*the run as a page: *myalloc_Factory.html*"])
    written = sorted(p.name for p in pages.iterdir())
    assert written == ["myalloc_Factory.html", "test_mine.py_test_mine_conforms.html"], written
    for name in written:
        text = (pages / name).read_text()
        assert 'id="verdict-ref_count_matches_references"><td>ref_count_matches_references' in text
        assert '<td class="violated">violated</td>' in text
        assert text.count('<figure class="timeline"') >= 1 and "c0p1-violation-" in text


@pytest.mark.slow
def test_plugin_under_xdist_reports_the_pass_and_the_seeded_bug(pytester: pytest.Pytester) -> None:
    """`pytest -n 2` (pytest-xdist): the kvspec items run in two worker processes; the correct adapter and the
    user's own test pass, the seeded bug fails with its invariant and its saved case, whichever worker ran it."""
    pytester.makepyfile(myalloc=BUGGY_MODULE, test_own="def test_own():\n    assert True\n")
    result = pytester.runpytest_subprocess(
        "-n", "2", "-p", "no:randomly", "--kvspec-adapter=reference", "--kvspec-adapter=myalloc:Factory",
        "--kvspec-max-examples=30", "-rA",
    )  # fmt: skip
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*2 workers*", "*VIOLATED ref_count_matches_references*", "*case saved:*"])
    result.stdout.fnmatch_lines(["*PASSED*kvspec?reference?*"])
    cases = list((pytester.path / ".kvspec" / "cases").glob("myalloc_Factory-ref_count_matches_references-*.json"))
    assert len(cases) == 1
