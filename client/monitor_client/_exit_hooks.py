"""Ending a run when the script ends: ``atexit`` for a normal exit, a chained
``sys.excepthook`` to remember an uncaught exception first (so ``end`` says ``failed``, or
``stopped`` on Ctrl-C), a wrapped ``sys.exit`` and ``exit``/``quit`` builtins for a
script's own ``sys.exit(1)`` or ``exit(1)`` (Python hands ``SystemExit`` to no hook: the run
would end ``completed``), a chained ``threading.excepthook`` for a loop run in a thread
of its own that dies of an exception, and SIGTERM, which ends it ``stopped``
(``_sigterm.py``).
Installed per Monitor and removed by its ``close()``. A ``raise SystemExit(1)`` written out
is still not seen: nothing in Python 3.11 tells an exit hook the status it exits with.

A Monitor passes its ``close()`` and its outcome setter. An uncaught Ctrl-C, as Python
reports it to ``sys.excepthook`` (the hook before ours, quiet here, is still called)::

    >>> saved, sys.excepthook = sys.excepthook, lambda *exc_info: None
    >>> outcomes = []
    >>> hooks = ExitHooks(on_exit=lambda: None,
    ...                   on_exception=lambda status, error: outcomes.append((status, error)))
    >>> hooks.install()
    >>> sys.excepthook(KeyboardInterrupt, KeyboardInterrupt(), None)
    >>> hooks.remove()
    >>> sys.excepthook = saved
    >>> outcomes
    [('stopped', 'KeyboardInterrupt: ')]
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from monitor_client._resume import ROLLBACK_EXIT
from monitor_client._sigterm import TermWatch

_SYS_EXIT = sys.exit  # what _sys_exit calls when it outlived its install (a kept reference)


def outcome_of(exc_type: type[BaseException], exc: BaseException) -> tuple[str, str | None]:
    """(status, error) for an exception that ended the run: Ctrl-C is the user's stop, a
    ``sys.exit()`` with code 0 or none the script ending on its own (as it ends when
    nothing raises), 75 a relaunch asked of the launcher (the rollback's and the restart's
    status), anything else a crash, which the sidecar pages (detectors/crashed.py).

        >>> outcome_of(SystemExit, SystemExit(0)), outcome_of(SystemExit, SystemExit(2))
        (('completed', None), ('failed', 'SystemExit: 2'))
        >>> outcome_of(SystemExit, SystemExit(75))[0]
        'stopped'
    """
    if issubclass(exc_type, SystemExit) and getattr(exc, "code", None) in (0, None):
        return "completed", None
    if issubclass(exc_type, SystemExit) and getattr(exc, "code", None) == ROLLBACK_EXIT:
        return "stopped", f"SystemExit: {ROLLBACK_EXIT} (a relaunch asked of its launcher)"
    status = "stopped" if issubclass(exc_type, KeyboardInterrupt) else "failed"
    return status, f"{exc_type.__name__}: {exc}"[:4000]


class ExitHooks:
    """Calls ``on_exception(status, error)`` for an uncaught exception, ``on_exit()`` at exit.

    ``remove()`` puts back the hook it found and unregisters ``on_exit``::

        >>> before = sys.excepthook
        >>> hooks = ExitHooks(on_exit=lambda: print("bye"), on_exception=print)
        >>> hooks.install()
        >>> sys.excepthook is before
        False
        >>> hooks.remove()
        >>> sys.excepthook is before
        True
    """

    def __init__(self, on_exit: Callable[[], object],
                 on_exception: Callable[[str, str | None], object],
                 on_term: Callable[[], object] | None = None,
                 trainer: Callable[[], int | None] = lambda: None) -> None:
        self._on_exit, self._on_exception = on_exit, on_exception
        self._trainer = trainer  # the ident of the thread that logs the steps, once known
        self._previous_thread_hook: Callable[..., object] | None = None
        self._previous: Callable[..., object] | None = None
        self._exit: Callable[..., object] | None = None
        self._quitters: dict[str, Any] = {}  # the builtins exit/quit this replaced
        self._failed = False  # an uncaught exception (or exit status) said the run failed
        # SIGTERM's close: ``on_term`` (False while a close drains: see TermWatch).
        self._term = TermWatch(on_signal=self._terminated,
                               on_end=on_exit if on_term is None else on_term)

    def install(self) -> None:
        self._previous = sys.excepthook
        sys.excepthook = self._excepthook
        self._previous_thread_hook = threading.excepthook
        threading.excepthook = self._thread_excepthook
        self._exit = sys.exit
        setattr(sys, "exit", self._sys_exit)  # noqa: B010 - mypy holds sys.exit's own type
        for name in ("exit", "quit"):  # the site module's, which scripts call as exit(1)
            found = getattr(builtins, name, None)
            if found is not None and type(found).__name__ == "Quitter":
                self._quitters[name] = found
                setattr(builtins, name, _Quitter(found, self._sys_exit))
        atexit.register(self._on_exit)
        self._term.install()

    def remove(self) -> None:
        if self._previous is None:
            return
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous
        if threading.excepthook == self._thread_excepthook and \
                self._previous_thread_hook is not None:
            threading.excepthook = self._previous_thread_hook
        if sys.exit == self._sys_exit and self._exit is not None:
            setattr(sys, "exit", self._exit)  # noqa: B010
        for name, found in self._quitters.items():
            if isinstance(getattr(builtins, name, None), _Quitter):
                setattr(builtins, name, found)
        self._quitters = {}
        atexit.unregister(self._on_exit)
        self._term.remove()
        self._previous = None

    def finish_term(self) -> None:
        """End the process now if SIGTERM came while the run's close was draining."""
        self._term.finish()

    def _sys_exit(self, status: Any = None) -> NoReturn:
        """``sys.exit(status)``: a status other than 0 or None is the script saying it
        failed (``sys.exit(1)``, argparse's 2, a message)."""
        if status not in (0, None):
            self._outcome(*outcome_of(SystemExit, SystemExit(status)))
        (self._exit or _SYS_EXIT)(status)
        raise SystemExit(status)  # (sys.exit raised already; a replaced one may not)

    def _excepthook(self, exc_type, exc, tb) -> None:
        self._outcome(*outcome_of(exc_type, exc))
        (self._previous or sys.__excepthook__)(exc_type, exc, tb)

    def _thread_excepthook(self, args: Any) -> None:
        """A loop run in a thread of its own (a GUI's, a server's) that dies of an
        exception ends the run failed, as an uncaught one on the main thread does; another
        thread's death (a logger's, a loader's) is not the run's."""
        thread = args.thread
        if thread is not None and thread.ident is not None and thread.ident == self._trainer() \
                and not issubclass(args.exc_type, SystemExit):
            self._outcome(*outcome_of(args.exc_type, args.exc_value))
        (self._previous_thread_hook or threading.__excepthook__)(args)

    def _outcome(self, status: str, error: str | None) -> None:
        self._failed = self._failed or status == "failed"
        self._on_exception(status, error)

    def _terminated(self, error: str) -> None:
        """SIGTERM's outcome, unless the run already failed: a launcher stops the other
        processes right after one crashed (torchrun, when a rank's collective raised), and
        the crash is what ended the run."""
        if not self._failed:
            self._on_exception("stopped", error)


class _Quitter:
    """The ``exit``/``quit`` builtin, its call going through the wrapped ``sys.exit``; it
    still prints as the one it replaced (``Use exit() or Ctrl-D (i.e. EOF) to exit``)."""

    def __init__(self, found: Any, exit_with: Callable[[Any], object]) -> None:
        self._found, self._exit_with = found, exit_with

    def __repr__(self) -> str:
        return repr(self._found)

    def __call__(self, code: Any = None) -> None:
        with contextlib.suppress(Exception):  # as the site module's: stdin closed first
            sys.stdin.close()
        self._exit_with(code)
