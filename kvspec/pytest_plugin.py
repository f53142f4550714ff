"""pytest plugin: `pytest --kvspec-adapter=NAME_OR_PATH` runs the conformance suite in any repo.

Each named adapter becomes one test item, ``kvspec[NAME]``, that fails with the
conformance table and the shrunk counterexample when an invariant breaks. The
``kvspec_check`` fixture runs the same check from a user's own test; ``vllm_live_server``
gives a running vLLM server (the kit's tiny one unless ``--kvspec-vllm-url``).

Under pytest-xdist (``pytest -n N``) every worker collects the same ``kvspec[NAME]`` items and
runs the ones it is given; nothing the plugin writes is shared between two items: a case file
is named by adapter, invariant and a digest of its content and written atomically (two
workers that find the same case write the same bytes), an ``--kvspec-html`` page by its
adapter or test id, and the fixture's cases go under the test's own ``tmp_path`` (per worker).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvspec.adapter import AdapterFactory
from kvspec.adapters import AdapterLoadError, UnknownAdapter, load
from kvspec.adapters.vllm_live.server import Endpoints, ServerStartError, TinyServer, attach, server_missing
from kvspec.report import Report
from kvspec.stateful_tests import Options, check_adapter, not_started
from kvspec.stateful_tests.options import add_flags, options_from


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvspec", "KV-cache lifecycle conformance")
    group.addoption(
        "--kvspec-adapter",
        action="append",
        default=[],
        metavar="NAME_OR_PATH",
        help="check this adapter (a name from `kvspec adapters` or pkg.module:Factory); repeatable",
    )
    add_flags(lambda _section: group.addoption, "plugin")  # the run options pytest sets: stateful_tests/options.py
    group.addoption(
        "--kvspec-html",
        default=None,
        metavar="DIR",
        help="write a failing check as one HTML page here, each case drawn as a block timeline (kvspec[show])",
    )


class ConformanceFailure(Exception):
    def __init__(self, report: Report, page: Path | None = None) -> None:
        self.report = report
        super().__init__(report.table() + (f"\nkvspec: the run as a page: {page}" if page is not None else ""))


class KvspecItem(pytest.Item):
    """The whole conformance suite against one adapter."""

    def __init__(self, *, adapter: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.adapter = adapter

    def runtest(self) -> None:
        result = _check(self.config, self.adapter, Path(str(self.config.rootpath)) / ".kvspec" / "cases")
        self.user_properties.append(("kvspec_status", result.status))
        if result.exit_code != 0:
            raise ConformanceFailure(result, _page(self.config, self.adapter, result))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"kvspec conformance of {self.adapter}"


def _name(adapter: str | AdapterFactory) -> str:
    return adapter if isinstance(adapter, str) else getattr(adapter, "__name__", repr(adapter))


def _page(config: pytest.Config, adapter: str | AdapterFactory, report: Report, stem: str = "") -> Path | None:
    """With ``--kvspec-html DIR``: the failing run as DIR/<stem or adapter>.html, each saved case drawn; its path."""
    folder = config.getoption("--kvspec-html")
    if folder is None:
        return None
    from kvspec.show import write_report_html

    path = Path(folder) / (re.sub(r"[^A-Za-z0-9_.-]+", "_", stem or _name(adapter)).strip("_.") + ".html")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        factory = load(adapter) if isinstance(adapter, str) else adapter
    except AdapterLoadError:
        factory = None
    live = "live" in report.sections
    write_report_html(path, report, None if live else factory, step_timeout=_options(config).step_timeout)
    return path


def _options(config: pytest.Config, cases_dir: Path | None = None) -> Options:
    """The run's Options from the plugin's flags; the plugin runs no coverage scenarios (the CLI does)."""
    fixed: dict[str, Any] = {"scenarios": False} if cases_dir is None else {"scenarios": False, "cases_dir": cases_dir}
    return options_from(config.getoption, "plugin", **fixed)


def _check(config: pytest.Config, adapter: str | AdapterFactory, cases_dir: Path) -> Report:
    name = _name(adapter)
    options = _options(config, cases_dir)
    try:
        factory = load(adapter) if isinstance(adapter, str) else adapter
    except AdapterLoadError as exc:
        return not_started(name, options, "error", str(exc))
    return check_adapter(factory, name, options)


def pytest_configure(config: pytest.Config) -> None:
    try:
        _options(config)
    except ValueError as exc:  # a run option's problem, said as its flag says it (options.py)
        raise pytest.UsageError(str(exc)) from exc
    if config.getoption("--kvspec-html", default=None) is not None:
        from kvspec.show import matplotlib_missing

        missing = matplotlib_missing()
        if missing is not None:
            raise pytest.UsageError(f"--kvspec-html: {missing}")
    adapters = config.getoption("--kvspec-adapter", default=[]) or []
    if adapters and str(config.rootpath) not in sys.path:
        sys.path.insert(0, str(config.rootpath))  # the user's repo: pkg.module:Factory resolves as in its tests
    for adapter in adapters:
        try:
            load(adapter)
        except UnknownAdapter as exc:  # a typo on the command line: usage
            raise pytest.UsageError(f"--kvspec-adapter: {exc}") from exc
        except AdapterLoadError:  # the user's module does not import: its item fails with the reason
            pass


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    for adapter in config.getoption("--kvspec-adapter"):
        items.append(KvspecItem.from_parent(session, name=f"kvspec[{adapter}]", adapter=adapter))


@pytest.fixture
def kvspec_check(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str | AdapterFactory], Report]:
    """Run the conformance suite on an adapter (name, path or factory); fails the test unless every invariant held."""

    def check(adapter: str | AdapterFactory) -> Report:
        report = _check(request.config, adapter, tmp_path / "cases")
        if report.exit_code != 0:
            page = _page(request.config, adapter, report, stem=request.node.nodeid)
            pytest.fail(report.table() + (f"\nkvspec: the run as a page: {page}" if page else ""), pytrace=False)
        return report

    return check


@pytest.fixture(scope="session")
def vllm_live_server(request: pytest.FixtureRequest) -> Iterator[Endpoints]:
    """A running vLLM server's endpoints: ``--kvspec-vllm-url`` if given, else the kit's tiny server.

    The tiny server (prefix caching, 63 usable blocks of 32 tokens, KV events on ipc://) starts once
    per session and is always stopped; without vLLM in this interpreter the test is skipped.
    """
    url = request.config.getoption("--kvspec-vllm-url")
    if url:
        events, replay = (
            request.config.getoption("--kvspec-vllm-events"),
            request.config.getoption("--kvspec-vllm-replay"),
        )
        yield attach(url, events, replay)
        return
    reason = server_missing()
    if reason is not None:
        pytest.skip(f"vllm_live_server needs vLLM: {reason}")
    server = TinyServer()
    try:
        endpoints = server.start()
    except ServerStartError as exc:
        pytest.fail(f"the tiny vLLM server did not come up: {exc}", pytrace=False)
    try:
        yield endpoints
    finally:
        server.stop()
