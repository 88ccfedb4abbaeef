"""Every deliberate error is an ``RlfleetError`` (rlfleet/errors.py).

* ``rlfleet/`` raises at most five built-in exceptions itself, each where a
  Python protocol or a test double needs the built-in type, with a
  ``builtin on purpose:`` comment saying why. The count reads every
  module's ``raise`` statements with ``ast``.
* Errors that callers catch as built-ins (garage and tianshou code catches
  ``ValueError``, ``IndexError``, ...) are ``RlfleetError`` subclasses that
  are also those built-ins.
"""

from __future__ import annotations

import ast
import builtins
import pickle
from pathlib import Path

import numpy as np
import pytest

from rlfleet.core._arrays import pad_to_last
from rlfleet.core.step_type import StepType
from rlfleet.envs import DummyVectorEnv
from rlfleet.envs.testing import CounterEnv
from rlfleet.errors import (
    InvalidValueError,
    OutOfRangeError,
    RlfleetError,
    WrongTypeError,
)
from rlfleet.sampling import discount_cumsum
from rlfleet.security.tokens import Token

PACKAGE = Path(__file__).resolve().parent.parent / "rlfleet"

#: At most this many raw built-in raises in rlfleet/ (each with its reason).
MAX_BUILTIN_RAISES = 5

#: Where a reason is looked for: the raise's own line or those just above it.
REASON_MARK = "builtin on purpose:"
REASON_LINES_ABOVE = 3

_BUILTIN_EXCEPTIONS = {
    name
    for name, value in vars(builtins).items()
    # Exception, not BaseException: KeyboardInterrupt and SystemExit are
    # control flow (a signal handler's way to stop), not errors; so is
    # StopIteration, an iterator's way to end a for loop.
    if isinstance(value, type) and issubclass(value, Exception) and value is not StopIteration
}


def _raised_builtin(node: ast.Raise) -> str | None:
    """The built-in exception a ``raise`` names (``raise X`` or ``raise X(...)``)."""
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    if isinstance(exc, ast.Name) and exc.id in _BUILTIN_EXCEPTIONS:
        return exc.id
    return None


def builtin_raises() -> list[tuple[str, int, str, bool]]:
    """Each raw built-in raise: module path, line, exception, whether it says why."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source, filename=str(path))):
            if isinstance(node, ast.Raise) and (name := _raised_builtin(node)):
                above = lines[max(0, node.lineno - 1 - REASON_LINES_ABOVE) : node.lineno]
                found.append((relative, node.lineno, name, any(REASON_MARK in s for s in above)))
    return found


def test_at_most_five_raw_builtin_raises_each_with_its_reason() -> None:
    raises = builtin_raises()
    listing = "\n".join(f"  rlfleet/{path}:{line}: raise {name}" for path, line, name, _ in raises)
    assert len(raises) <= MAX_BUILTIN_RAISES, (
        f"{len(raises)} raw built-in raises in rlfleet/ (at most {MAX_BUILTIN_RAISES}); raise an "
        f"RlfleetError subclass from rlfleet/errors.py instead:\n{listing}"
    )
    unexplained = [f"rlfleet/{p}:{line}: raise {n}" for p, line, n, why in raises if not why]
    assert not unexplained, (
        f"a raw built-in raise needs a '# {REASON_MARK} <why>' comment: {unexplained}"
    )


def test_the_counter_sees_every_shape_of_raise(tmp_path: Path) -> None:
    node = ast.parse("raise ValueError\nraise KeyError('x')\nraise exc\nraise\n").body
    assert [_raised_builtin(n) for n in node if isinstance(n, ast.Raise)] == [
        "ValueError",
        "KeyError",
        None,
        None,
    ]


@pytest.mark.parametrize(
    ("call", "error", "builtin"),
    [
        (lambda: discount_cumsum(np.zeros(3), 2.0), InvalidValueError, ValueError),
        (lambda: StepType.get_step_type(0, False, False), InvalidValueError, ValueError),
        (lambda: pad_to_last(np.zeros((2, 1)), 3, axis=2), OutOfRangeError, IndexError),
        (lambda: pickle.dumps(Token("x" * 32)), WrongTypeError, TypeError),
    ],
    ids=["discount", "step_cnt", "axis", "token-pickle"],
)
def test_errors_are_rlfleet_errors_and_the_builtins_callers_catch(
    call: object, error: type[RlfleetError], builtin: type[Exception]
) -> None:
    with pytest.raises(error) as info:
        call()  # type: ignore[operator]
    assert isinstance(info.value, RlfleetError) and isinstance(info.value, builtin)


def test_a_vector_envs_bad_ids_are_rlfleet_errors_tianshou_callers_still_catch() -> None:
    envs = DummyVectorEnv([CounterEnv, CounterEnv])
    try:
        envs.reset()
        with pytest.raises(IndexError, match="out of range") as out_of_range:
            envs.reset(id=[2])
        with pytest.raises(ValueError, match="distinct") as repeated:
            envs.reset(id=[0, 0])
    finally:
        envs.close()
    assert isinstance(out_of_range.value, OutOfRangeError)
    assert isinstance(repeated.value, InvalidValueError)
