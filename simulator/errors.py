"""Typed errors: invalid input (the user wrote something wrong) vs infeasible plan.

Library code raises these and never exits; the CLI prints ``str(err)`` on one line.
"""
from __future__ import annotations

from typing import Any, Mapping


class ComplexityError(Exception):
    """Base of every error this package raises on purpose."""


class InvalidInputError(ComplexityError, ValueError):
    """A field has a bad value. Names the field, the value and what would be valid."""

    def __init__(self, field: str, value: Any, valid: str, detail: str = "") -> None:
        self.field = field
        self.value = value
        self.valid = valid
        self.detail = detail
        msg = f"invalid {field}={value!r}: {valid}"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)


class ProfileError(InvalidInputError):
    """A calibration profile is missing, unreadable, or from another schema version."""


class UnsupportedError(ComplexityError):
    """A valid request that this tool does not model (yet)."""


class InfeasiblePlanError(ComplexityError):
    """A valid plan that cannot run: memory, topology, divisibility against the cluster.

    ``reason`` is a short machine-friendly tag (``"memory"``, ``"topology"``, ...);
    ``numbers`` carries the figures that prove it (bytes needed vs available, ...).
    """

    def __init__(self, reason: str, message: str, numbers: Mapping[str, float] | None = None):
        self.reason = reason
        self.numbers = dict(numbers or {})
        super().__init__(f"infeasible ({reason}): {message}")


class CalibrationMissingError(ComplexityError):
    """The profile has no coefficient for something the simulation needs."""


class Terminated(BaseException):
    """SIGTERM arrived (a ``BaseException``, like ``KeyboardInterrupt``, so no library
    ``except Exception`` swallows it)."""


# A stop signal the CLI's handler has seen. Python runs a signal handler between bytecodes
# of the main thread, also inside callbacks whose exceptions it only prints ("Exception
# ignored in ...": os.fork()'s at-fork hooks, __del__): a ``Terminated`` raised there is
# lost. Long loops call ``raise_if_stopped`` so the request still ends them.
_stop_signal = 0


def note_stop_signal(signum: int) -> None:
    global _stop_signal
    _stop_signal = signum


def clear_stop_signal() -> None:
    global _stop_signal
    _stop_signal = 0


def stop_requested() -> bool:
    """Whether a stop signal has arrived (see ``note_stop_signal``)."""
    return bool(_stop_signal)


def raise_if_stopped() -> None:
    """``Terminated`` if a stop signal arrived (whether or not its own raise got through)."""
    if _stop_signal:
        raise Terminated()
