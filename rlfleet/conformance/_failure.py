"""The exception a check raises to fail, with the reason as its message."""

from __future__ import annotations


class CheckFailed(Exception):  # noqa: N818 (reads as a statement: "check failed: ...")
    """The worker did not behave as the protocol requires.

    The message says what was expected and what came instead.
    """


__all__ = ["CheckFailed"]
