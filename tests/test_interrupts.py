"""A stop signal that arrives disguised: ``KeyboardInterrupt`` wrapped by the code it interrupted.

The CLI (``loadgen.cli.main``) exits 128 + the signal's number, without a traceback, whenever the exception that
ends a command was caused by an interrupt (``interrupts.caused_by_interrupt``). Seen in the slow tier: SIGTERM
while ``practice`` imported anyio's asyncio backend, inside class creation, surfaced as ``RuntimeError: Error
calling __set_name__``.
"""

from __future__ import annotations

import pytest

from loadgen.util.interrupts import caused_by_interrupt


class _InterruptedOnSetName:
    def __set_name__(self, owner: type, name: str) -> None:
        raise KeyboardInterrupt  # what the SIGINT handler raises at that instant


def _class_creation_interrupted() -> BaseException:
    """The exception CPython raises when an interrupt lands inside class creation (3.11 wraps it)."""
    try:

        class _Owner:
            field = _InterruptedOnSetName()

    except BaseException as exc:  # the point is what arrives
        return exc
    pytest.fail("class creation was not interrupted")


def test_an_interrupt_wrapped_by_class_creation_is_recognised() -> None:
    exc = _class_creation_interrupted()
    assert caused_by_interrupt(exc)


def test_an_interrupt_in_an_exception_group_or_a_context_is_recognised() -> None:
    assert caused_by_interrupt(BaseExceptionGroup("tasks", [ValueError("a"), KeyboardInterrupt()]))
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise OSError("closing during the stop") from None
    except OSError as exc:
        assert exc.__cause__ is None and caused_by_interrupt(exc)  # the stop is its context


def test_an_ordinary_failure_is_not_an_interrupt() -> None:
    try:
        try:
            raise ValueError("bad")
        except ValueError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as exc:
        assert not caused_by_interrupt(exc)
    assert not caused_by_interrupt(BaseExceptionGroup("tasks", [ValueError("a")]))
