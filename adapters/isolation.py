"""An adapter run in a child process, every call under a timeout.

The implementation under test is user code: it may hang, call ``os._exit``, raise
``SystemExit`` or ``KeyboardInterrupt``, or crash the interpreter. :class:`IsolatedAdapter`
keeps all of that out of the kit's process: the adapter is built and driven in a child
forked from the kit (so a factory may be any callable, a lambda or a closure: nothing is
pickled but ops and answers), and the kit talks to it over a pipe. What it keeps:

- a call that does not answer within its timeout kills the child and raises
  :class:`CallTimeout`; nothing of the kit waits on it again, so it can never keep the
  kit's process alive;
- a child that dies during a call (``os._exit``, a signal, a crash) raises
  :class:`ChildDied` with its exit status; the next :meth:`~IsolatedAdapter.reset` forks a
  fresh child, so a run goes on (and a death can be shrunk like any other failure);
- whatever adapter code raises (``BaseException`` included) comes back as
  :class:`RemoteError`, with the original type's name: a finding, never the kit's exit;
- the child ignores SIGINT and SIGTERM (the user's interrupt is the kit's to handle) and
  dies with the kit (``PR_SET_PDEATHSIG`` where Linux has it; the pipe closing otherwise).

Why a process and not a thread: a thread stuck in adapter code cannot be stopped and
keeps a non-daemon interpreter alive at exit, and ``os._exit`` in a thread ends the kit
itself, so it could report nothing. Cost: one pipe round trip per step (the harness's
:meth:`~IsolatedAdapter.step` sends apply, events and observe as one call); taking deltas, the child
compares the adapter's full observation with its copy of the kit's kept state (adapters/kept.py), so the
whole observation crosses only where they differ.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import multiprocessing
import os
import pickle
import select
import signal
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import ForkingPickler
from typing import Any

from kvspec.adapter import Adapter, Capabilities, Config, Event, Observation, Op, Outcome

from .kept import Agreed, KeptState

START_TIMEOUT_S = 120.0
"""The least time a constructor gets: importing an engine (vLLM: ~12 s here, more on a loaded CI) is slow."""

_LIVE: set[BaseProcess] = set()
"""Children alive now, so that a second interrupt can kill them before the kit exits at once."""


class AdapterFault(Exception):
    """The adapter did not answer a call as an adapter must."""


class CallTimeout(AdapterFault):
    """A call did not return within its timeout; the child was killed."""


class ChildDied(AdapterFault):
    """The child running the adapter ended during a call."""


class RemoteError(AdapterFault):
    """Adapter code raised; ``type_name`` is the original exception's type, the message its text."""

    def __init__(self, type_name: str, message: str, where: str = "") -> None:
        self.type_name, self.where = type_name, where
        super().__init__(message)


def kill_children() -> None:
    """Kill every isolated adapter still running: at exit, and on a second interrupt (the kit exits now).

    Children ignore SIGTERM (the user's signals are the kit's), so multiprocessing's own exit
    handler, which terminates and then joins them, would wait forever: this runs before it.
    """
    for child in list(_LIVE):
        with contextlib.suppress(Exception):
            child.kill()
            child.join(timeout=5)
        _LIVE.discard(child)


def track(process: BaseProcess) -> None:
    """Count ``process`` (another child of the kit: a ``--workers`` worker) among the children
    :func:`kill_children` kills on a second interrupt; :func:`untrack` once it has been joined."""
    _LIVE.add(process)


def untrack(process: BaseProcess) -> None:
    _LIVE.discard(process)


def live_children() -> int:
    """How many isolated adapters are running now (a test can assert that none leaked)."""
    return sum(1 for child in _LIVE if child.is_alive())


atexit.register(kill_children)  # after multiprocessing registered its handler: atexit runs this one first


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _answer(adapter: Any, kept: KeptState, method: str, args: tuple[Any, ...]) -> Any:
    if method == "step":  # apply, then what it evicted and what it left: one round trip per step
        op, observe = args
        outcome = adapter.apply(op)
        return outcome, adapter.events(), _observe(adapter, kept, observe)
    if method == "meta":
        return adapter.name, adapter.capabilities
    if method == "observe_keeping":
        obs = adapter.observe()
        kept.start(obs)
        return obs
    if method == "observe_compared":
        obs = adapter.observe()
        agreed = kept.compare(None, obs, end=True)
        return (None, agreed) if agreed else (obs, None)
    if method == "reset":
        kept.drop()
    return getattr(adapter, method)(*args)


def _observe(adapter: Any, kept: KeptState, observe: str) -> Any:
    """What a step left: ``full`` the observation; ``delta`` the adapter's delta, or its observation when it
    gives none; ``both`` (delta or None, observation), for the kit to compare them (spec/delta.py);
    ``compared`` (delta or None, the observation or None, :class:`~.kept.Agreed` or None): the observation
    compared here with the state kept from the deltas (adapters/kept.py) and sent only where they differ
    (then Agreed is None). ``delta`` and ``compared`` keep :class:`~.kept.KeptState`'s rule."""
    if observe == "full":
        return adapter.observe()
    delta = adapter.observe_delta()
    if observe == "delta":
        answer = adapter.observe() if delta is None else delta
        kept.apply(answer)
        return answer
    if observe == "compared":
        obs = adapter.observe()
        agreed = kept.compare(delta, obs)
        return delta, None if agreed else obs, agreed
    return delta, adapter.observe()


def _serve(factory: Callable[[], Adapter], conn: Connection) -> None:
    """The child: build the adapter, then answer calls until the pipe closes or ``close`` is called."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    _die_with_parent()
    adapter: Any = None
    kept = KeptState()
    while True:
        try:
            method, args = conn.recv()
        except (EOFError, OSError):
            break
        try:
            adapter = factory() if method == "build" else adapter
            reply: tuple[Any, ...] = ("ok", None if method == "build" else _answer(adapter, kept, method, args))
        except BaseException as exc:
            where = "".join(traceback.format_exception(exc, limit=-3)).strip()
            reply = ("raised", type(exc).__name__, str(exc), where)
        try:
            conn.send_bytes(pickle.dumps(reply, pickle.HIGHEST_PROTOCOL))  # plain pickle: no ForkingPickler per call
        except Exception as exc:  # the answer does not pickle: say so instead
            conn.send(("raised", type(exc).__name__, f"the adapter's answer cannot be sent to the checker: {exc}", ""))
        if method == "close":
            break
    conn.close()
    os._exit(0)  # no atexit handlers of the kit's process in the child


class IsolatedAdapter:
    """An :class:`~kvspec.adapter.contract.Adapter` whose implementation runs in a child process.

    Invariant: at most one child at a time; every call either answers within its timeout or
    raises an :class:`AdapterFault`; after a timeout or a death there is no child until the
    next :meth:`reset`, which forks a fresh one.
    """

    def __init__(self, factory: Callable[[], Adapter], timeout: float | None = 30.0) -> None:
        self.factory, self.timeout = factory, timeout
        self._child: BaseProcess | None = None
        self._conn: Connection | None = None
        self.bytes_received = 0  # every answer's pickled bytes that crossed the pipe (a test can read what crossed)
        # A step sent ahead (:meth:`send_ahead`) and not answered yet: (op, observe, deadline, the fault sending it
        # raised, for its step to raise); None: nothing in flight.
        self._ahead: tuple[Op, str, float | None, AdapterFault | None] | None = None
        self._spawn()
        try:
            name, caps = self._call("meta", timeout=self._start_timeout)
        except BaseException:
            self._stop()
            raise
        self.name: str = name
        self.capabilities: Capabilities = caps

    @property
    def _start_timeout(self) -> float | None:
        return None if self.timeout is None else max(self.timeout, START_TIMEOUT_S)

    def _spawn(self) -> None:
        """Fork a child and build the adapter there (under the start timeout)."""
        ctx = multiprocessing.get_context("fork")
        parent, child_end = ctx.Pipe()
        child = ctx.Process(target=_serve, args=(self.factory, child_end), daemon=True, name="kvspec-adapter")
        child.start()
        child_end.close()
        _LIVE.add(child)
        self._child, self._conn = child, parent
        self._readable = select.poll()  # one poll object per child: Connection.poll builds a selector per call
        self._readable.register(parent.fileno(), select.POLLIN)
        try:
            self._call("build", timeout=self._start_timeout)
        except BaseException:  # the constructor raised or hung: no child outlives a failed start
            self._stop()
            raise

    def _stop(self) -> None:
        child, conn = self._child, self._conn
        self._child = self._conn = None
        if conn is not None:
            conn.close()
        if child is not None:
            if child.is_alive():
                child.kill()
            child.join(timeout=5)
            _LIVE.discard(child)

    def _call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        self._drop_ahead()
        limit = self.timeout if timeout is None else timeout
        deadline = self._send(method, args, limit)
        return self._receive(method, limit, deadline)

    def _send(self, method: str, args: tuple[Any, ...], limit: float | None) -> float | None:
        """Send one call; its deadline (None: no limit). The child answers calls in the order they were sent."""
        if self._conn is None or self._child is None:
            raise ChildDied(f"{method}: the adapter's process is gone (a previous call hung or it died)")
        try:
            self._conn.send_bytes(pickle.dumps((method, args), pickle.HIGHEST_PROTOCOL))
        except (EOFError, OSError):
            raise self._died(method) from None
        except BaseException:
            self._stop()
            raise
        return None if limit is None else time.monotonic() + limit

    def _receive(self, method: str, limit: float | None, deadline: float | None) -> Any:
        """The answer to the call sent last, by ``deadline``; a timeout kills the child (CallTimeout)."""
        if self._conn is None or self._child is None:
            raise ChildDied(f"{method}: the adapter's process is gone (a previous call hung or it died)")
        conn, child = self._conn, self._child
        try:
            while not self._readable.poll(50):  # ms; an answer, or the pipe closed (then recv_bytes raises EOFError)
                if not child.is_alive() and not conn.poll(0):
                    raise EOFError
                if deadline is not None and time.monotonic() > deadline:
                    self._stop()
                    raise CallTimeout(f"{method} did not return within {limit:g} s")
            data = conn.recv_bytes()
            self.bytes_received += len(data)
            reply = ForkingPickler.loads(data)
        except (EOFError, OSError):
            raise self._died(method) from None
        except BaseException:  # a timeout, or the kit interrupted mid-call: the pipe is out of step, end the child
            self._stop()
            raise
        if reply[0] == "raised":
            raise RemoteError(*reply[1:])
        return reply[1]

    # -- the adapter contract -------------------------------------------------------------

    def _died(self, method: str) -> ChildDied:
        """The child ended during ``method``: joined and forgotten; how it ended."""
        child = self._child
        code = None
        if child is not None:
            child.join(timeout=5)
            code = child.exitcode
        self._stop()
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return ChildDied(f"the adapter's process {how} during {method}")

    def _drop_ahead(self) -> None:
        """Read and discard the answer to a step sent ahead that no :meth:`step` took (the step before it broke
        an invariant, so the walk ended): under its timeout; whatever it raised is dropped with it, and a hang or
        a death leaves no child (the next :meth:`reset` forks a fresh one)."""
        if self._ahead is None:
            return
        _, _, deadline, fault = self._ahead
        self._ahead = None
        if fault is None:
            with contextlib.suppress(AdapterFault):
                self._receive("step", self.timeout, deadline)

    def reset(self, config: Config) -> None:
        """Start over with an empty pool; a fresh child first if the last one hung or died."""
        self._drop_ahead()
        if self._child is None:
            self._spawn()
        self._call("reset", config)

    def apply(self, op: Op) -> Outcome:
        result: Outcome = self._call("apply", op)
        return result

    def observe(self) -> Observation:
        result: Observation = self._call("observe")
        return result

    def events(self) -> list[Event]:
        result: list[Event] = self._call("events")
        return result

    def step(self, op: Op, observe: str = "full") -> tuple[Any, Any, Any]:
        """apply(op), events(), observe(), in one round trip; the answers unchecked (the harness judges them).

        ``observe``: ``full`` (the observation), ``delta`` (the adapter's delta, only what changed crosses
        the pipe; its observation when it gives none), ``both`` (delta or None, and the observation) or
        ``compared`` (delta or None, the observation or None, :class:`~.kept.Agreed` or None: where the state
        the child keeps from the deltas equals the observation, Agreed and no observation; the observation
        crosses only where they differ, adapters/kept.py).
        """
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] is op and ahead[1] == observe:  # sent ahead: only its answer to wait for
            if ahead[3] is not None:
                raise ahead[3]
            answer: tuple[Any, Any, Any] = self._receive("step", self.timeout, ahead[2])
            return answer
        self._ahead = ahead
        answer = self._call("step", op, observe)
        return answer

    def send_ahead(self, op: Op, observe: str = "full") -> None:
        """Send ``step(op, observe)`` now and return at once, so that the child runs it while the kit checks the
        step before; the next :meth:`step` with this very ``op`` only waits for its answer.

        Attribution stays the step's own: the call's timeout runs from now, and its answer, a hang or a death is
        raised by that :meth:`step`, never by another call. An answer no step takes (the walk ended first) is
        read and dropped before the child's next call (:meth:`_drop_ahead`)."""
        self._drop_ahead()
        try:
            self._ahead = (op, observe, self._send("step", (op, observe), self.timeout), None)
        except AdapterFault as fault:  # the child is gone: its step says so
            self._ahead = (op, observe, None, fault)

    def observe_keeping(self) -> Observation:
        """observe(), and the child keeps the state kept from the deltas from it (an example's start)."""
        result: Observation = self._call("observe_keeping")
        return result

    def observe_compared(self) -> tuple[Any, Agreed | None]:
        """observe(), compared in the child with the state it kept from the deltas (an example's end):
        ``(observation, None)`` where they differ, ``(None, Agreed)`` where they agree (nothing else crosses)."""
        result: tuple[Any, Agreed | None] = self._call("observe_compared")
        return result

    def observe_delta(self) -> Any:
        return self._call("observe_delta")

    def close(self) -> None:
        """Close the adapter (under the timeout) and end its child; a hang or death here is reported too."""
        try:
            self._drop_ahead()
            if self._child is not None:
                self._call("close")
        finally:
            self._stop()

    def __enter__(self) -> IsolatedAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()


def isolated(factory: Callable[[], Adapter], timeout: float | None = 30.0) -> Callable[[], IsolatedAdapter]:
    """A factory of isolated adapters built by ``factory`` in their own child process."""

    def build() -> IsolatedAdapter:
        return IsolatedAdapter(factory, timeout)

    build.__name__ = getattr(factory, "__name__", "adapter")
    return build


__all__ = [
    "START_TIMEOUT_S",
    "AdapterFault",
    "CallTimeout",
    "ChildDied",
    "IsolatedAdapter",
    "RemoteError",
    "isolated",
    "kill_children",
    "live_children",
    "track",
    "untrack",
]
