"""StepType: where a time step sits in its episode (garage's ``StepType``).

The last step of an episode is either ``TERMINAL`` (the MDP reached a
terminal state: do not bootstrap from the next observation) or ``TIMEOUT``
(the episode was cut off: the next observation still has a value).

gymnasium reports both facts separately: ``terminated`` maps to
``TERMINAL``, ``truncated`` or reaching the max episode length maps to
``TIMEOUT`` (see :func:`step_type_from_gym`).
"""

from __future__ import annotations

import enum

from rlfleet.errors import InvalidValueError


class StepType(enum.IntEnum):
    """The status of a time step within its episode.

    With ``max_episode_length = 5``:

    * an episode that terminates at step 4: FIRST, MID, MID, TERMINAL;
    * an episode that terminates at step 5 (``get_step_type``): FIRST, MID,
      MID, MID, TIMEOUT (garage lets the limit win; ``step_type_from_gym``
      gives TERMINAL);
    * an episode cut off by the time limit: FIRST, MID, MID, MID, TIMEOUT.

    The values are part of the wire contract: FIRST=0, MID=1, TERMINAL=2,
    TIMEOUT=3.
    """

    FIRST = 0
    MID = 1
    TERMINAL = 2
    TIMEOUT = 3

    @classmethod
    def get_step_type(cls, step_cnt: int, max_episode_length: int | None, done: bool) -> StepType:
        """Determines the step type from the step count and a done signal.

        Follows garage's precedence exactly: the time limit first, then
        ``done``, then the first step. So a ``done`` on the last allowed step
        is a TIMEOUT; use :func:`step_type_from_gym` to keep true terminals.

        Args:
            step_cnt: 1-based index of the step just taken in its episode.
            max_episode_length: The episode length limit, or None.
            done: The done signal the environment returned.

        Returns:
            The step type.

        Raises:
            InvalidValueError: If ``step_cnt`` < 1 (the env was probably not reset).
        """
        _check_step_cnt(step_cnt)
        if max_episode_length is not None and step_cnt >= max_episode_length:
            return cls.TIMEOUT
        if done:
            return cls.TERMINAL
        if step_cnt == 1:
            return cls.FIRST
        return cls.MID


#: Module-level alias of :meth:`StepType.get_step_type`.
get_step_type = StepType.get_step_type


def step_type_from_gym(
    step_cnt: int, max_episode_length: int | None, terminated: bool, truncated: bool
) -> StepType:
    """Maps a gymnasium ``step`` result to a StepType.

    ``terminated`` maps to TERMINAL and wins over truncation, because a true
    terminal state must not be bootstrapped from even when the time limit
    was reached on the same step. ``truncated``, or reaching
    ``max_episode_length``, maps to TIMEOUT. Otherwise the first step is
    FIRST and any other step MID.

    Args:
        step_cnt: 1-based index of the step just taken in its episode.
        max_episode_length: The episode length limit, or None.
        terminated: gymnasium's ``terminated`` flag.
        truncated: gymnasium's ``truncated`` flag.

    Returns:
        The step type.

    Raises:
        InvalidValueError: If ``step_cnt`` < 1 (the env was probably not reset).
    """
    _check_step_cnt(step_cnt)
    if terminated:
        return StepType.TERMINAL
    if truncated or (max_episode_length is not None and step_cnt >= max_episode_length):
        return StepType.TIMEOUT
    if step_cnt == 1:
        return StepType.FIRST
    return StepType.MID


def _check_step_cnt(step_cnt: int) -> None:
    # garage raises only after the other branches; checking first also
    # rejects a done signal on step 0, which can only come from a missing reset.
    if step_cnt < 1:
        raise InvalidValueError(
            f"step_cnt must be >= 1 (1 is the first step after reset), got {step_cnt}. "
            "Did you forget to call reset()?"
        )
