"""StepType values and the two ways of deriving a step type."""

from __future__ import annotations

import pytest

from rlfleet.core import StepType, get_step_type, step_type_from_gym

F, M, TERM, TOUT = StepType.FIRST, StepType.MID, StepType.TERMINAL, StepType.TIMEOUT


def test_values_are_the_wire_contract() -> None:
    assert [(s.name, int(s)) for s in StepType] == [
        ("FIRST", 0),
        ("MID", 1),
        ("TERMINAL", 2),
        ("TIMEOUT", 3),
    ]


@pytest.mark.parametrize(
    ("step_cnt", "max_len", "done", "expected"),
    [
        (1, 5, False, F),
        (2, 5, False, M),
        (4, 5, False, M),
        (5, 5, False, TOUT),
        (6, 5, False, TOUT),
        (3, 5, True, TERM),
        # garage's precedence: the limit beats done, done beats FIRST.
        (5, 5, True, TOUT),
        (1, 5, True, TERM),
        (1, 1, False, TOUT),
        (1, 1, True, TOUT),
        (1000, None, False, M),
        (1, None, False, F),
        (1000, None, True, TERM),
    ],
)
def test_get_step_type_follows_garage_precedence(
    step_cnt: int, max_len: int | None, done: bool, expected: StepType
) -> None:
    assert StepType.get_step_type(step_cnt, max_len, done) is expected
    assert get_step_type(step_cnt, max_len, done) is expected


@pytest.mark.parametrize(
    ("step_cnt", "max_len", "terminated", "truncated", "expected"),
    [
        (1, 5, False, False, F),
        (3, 5, False, False, M),
        (3, 5, True, False, TERM),
        (3, 5, False, True, TOUT),
        (5, 5, False, False, TOUT),
        # A true terminal on the last allowed step stays TERMINAL.
        (5, 5, True, False, TERM),
        (3, 5, True, True, TERM),
        (1, 5, True, False, TERM),
        (1, 5, False, True, TOUT),
        (1, 1, False, False, TOUT),
        (9, None, False, False, M),
        (9, None, False, True, TOUT),
    ],
)
def test_step_type_from_gym(
    step_cnt: int, max_len: int | None, terminated: bool, truncated: bool, expected: StepType
) -> None:
    assert step_type_from_gym(step_cnt, max_len, terminated, truncated) is expected


@pytest.mark.parametrize("step_cnt", [0, -1])
def test_step_cnt_below_one_is_rejected_whatever_the_flags(step_cnt: int) -> None:
    with pytest.raises(ValueError, match=rf"step_cnt must be >= 1.*got {step_cnt}.*reset"):
        StepType.get_step_type(step_cnt, 5, True)
    with pytest.raises(ValueError, match="reset"):
        step_type_from_gym(step_cnt, None, False, True)
