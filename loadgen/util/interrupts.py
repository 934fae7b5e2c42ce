"""SIGTERM and SIGHUP behave like Ctrl-C (SIGINT): stop sending, cancel what is in flight, close the files.

``timeout``, ``docker stop``, CI cancellation and a closed terminal send SIGTERM or SIGHUP, not SIGINT.
``install`` (called once by the CLI) makes both run whatever SIGINT does at that moment: Python's
default raises ``KeyboardInterrupt``; inside ``anyio.run`` the asyncio runner's handler cancels the
main task, so the driver's ``finally`` blocks record every request and close the run directory. The
signal received is remembered (``received``) for the manifest (``interrupted_by``) and the exit
status, 128 + its number (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

__all__ = ["STOP_SIGNALS", "cancel_cause", "caused_by_interrupt", "exit_code", "install", "received", "signal_name"]

#: Signals that stop a run the way Ctrl-C does.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

_received: int | None = None


def _forward(signum: int, frame: FrameType | None) -> None:
    """Run the current SIGINT handler for ``signum`` (remembering which signal it was)."""
    global _received
    _received = signum
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:  # SIG_DFL / SIG_IGN on SIGINT: still stop, the way Python's default SIGINT handler does
        raise KeyboardInterrupt


def install() -> None:
    """Route SIGTERM and SIGHUP through SIGINT's handler (main thread only; a no-op elsewhere).

    An inherited *ignored* SIGINT (a background job of a non-interactive shell: ``loadgen run ... &`` in a
    script) is replaced by Python's default handler. Otherwise the asyncio runner installs no handler of its
    own, SIGINT would not stop a run at all, and SIGTERM would raise ``KeyboardInterrupt`` inside whatever
    callback is running (seen: inside a transport's ``data_received``, which the loop reports and carries on).
    An ignored SIGHUP (``nohup``) is replaced likewise: every stop signal stops a run the same way.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in STOP_SIGNALS:
        signal.signal(sig, _forward)


def caused_by_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is a stop (``KeyboardInterrupt``) wrapped by the code it interrupted.

    A stop signal raises ``KeyboardInterrupt`` wherever the main thread is; when that is inside machinery that
    re-raises what it catches as another exception, the stop arrives disguised. Seen: SIGTERM while a module was
    being imported, inside class creation, which CPython 3.11 reports as ``RuntimeError: Error calling
    __set_name__`` with the ``KeyboardInterrupt`` as its cause. Follows causes, contexts and exception groups.
    """
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, KeyboardInterrupt):
            return True
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
    return False


def received() -> int | None:
    """The stop signal received by this process (SIGTERM/SIGHUP; None when none, or SIGINT)."""
    return _received


def signal_name(signum: int | None = None) -> str:
    """``SIGTERM`` ... for the manifest; SIGINT when no other stop signal was received."""
    signum = _received if signum is None else signum
    return signal.Signals(signum).name if signum is not None else "SIGINT"


def exit_code() -> int:
    """128 + the stop signal's number (SIGINT when none was recorded)."""
    return 128 + int(_received if _received is not None else signal.SIGINT)


def cancel_cause() -> str:
    """Why the running ``anyio.run`` was cancelled: the stop signal's name, else ``cancelled`` (a caller).

    Ctrl-C reaches a running event loop through the asyncio runner's own SIGINT handler, which counts
    interrupts; that count is read when it can be.
    """
    if _received is not None:
        return signal_name(_received)
    handler = signal.getsignal(signal.SIGINT)
    runner = getattr(getattr(handler, "func", None), "__self__", None)
    if getattr(runner, "_interrupt_count", 0):
        return "SIGINT"
    return "cancelled"
