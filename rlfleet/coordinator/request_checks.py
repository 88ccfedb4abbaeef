"""Checks of what a learner's Sample and Subscribe calls ask for.

The errors name the request's fields as learner.proto spells them: the
learner may speak the protocol without rlfleet's client.
"""

from __future__ import annotations

from rlfleet.coordinator.failures import invalid
from rlfleet.protocol.learner_calls import SampleAsk, SubscribeAsk
from rlfleet.protocol.modes import Mode

#: The largest int64: episode indices travel in int64 fields.
_INT64_MAX = 2**63 - 1
#: SampleRequest.mode's valid values.
_SAMPLE_MODES = frozenset(int(mode) for mode in Mode)


def sample_mode(request: SampleAsk, max_fragment_length: int) -> Mode:
    """The mode of a Sample request, after checking its fields.

    Raises:
        CallError: INVALID_ARGUMENT naming the bad field (or the limit).
    """
    if int(request.mode) not in _SAMPLE_MODES:
        raise invalid(
            f"SampleRequest.mode must be SAMPLE_MODE_STEPS (1), SAMPLE_MODE_EPISODES (2) or "
            f"SAMPLE_MODE_FRAGMENTS (3), got {int(request.mode)}"
        )
    mode = Mode(request.mode)
    if request.amount < 1:
        raise invalid(f"SampleRequest.amount must be >= 1, got {request.amount}")
    if mode is Mode.FRAGMENTS:
        if request.fragment_length < 1:
            raise invalid("SAMPLE_MODE_FRAGMENTS needs fragment_length >= 1")
        check_fragment_length(request.fragment_length, max_fragment_length)
    if request.first_episode:
        if mode is not Mode.EPISODES:
            raise invalid(
                "SampleRequest.first_episode is for SAMPLE_MODE_EPISODES only, got "
                f"first_episode={request.first_episode} with mode {mode.name}"
            )
        if request.first_episode + request.amount > _INT64_MAX + 1:
            raise invalid(
                f"SampleRequest.first_episode + amount must be <= 2**63, got "
                f"{request.first_episode} + {request.amount}"
            )
    # NaN fails every comparison, so "not >= 0" refuses it too (it would wait forever).
    if not request.wait_for_workers_seconds >= 0:
        raise invalid(
            f"wait_for_workers_seconds must be >= 0, got {request.wait_for_workers_seconds}"
        )
    return mode


def check_fragment_length(fragment_length: int, limit: int) -> None:
    """Refuses windows longer than the coordinator's limit.

    A worker holds a whole window of every env slot in memory and sends it
    as one result, so an unbounded window could exhaust its memory.

    Raises:
        CallError: INVALID_ARGUMENT naming the limit and the flag that sets it.
    """
    if fragment_length > limit:
        raise invalid(
            f"fragment_length {fragment_length} is above this coordinator's limit of {limit} "
            "steps per env slot and window (--max-fragment-length); ask for more windows of "
            "at most that length instead"
        )


def subscription_mode(request: SubscribeAsk, max_fragment_length: int) -> Mode:
    """The mode of a Subscribe request, after checking its fields.

    Raises:
        CallError: INVALID_ARGUMENT naming the bad field.
    """
    if int(request.mode) not in (Mode.EPISODES, Mode.FRAGMENTS):
        raise invalid(
            "SubscribeRequest.mode must be SAMPLE_MODE_EPISODES (2) or SAMPLE_MODE_FRAGMENTS "
            f"(3), got {int(request.mode)}"
        )
    mode = Mode(request.mode)
    if mode is Mode.FRAGMENTS:
        if request.fragment_length < 1:
            raise invalid("a FRAGMENTS subscription needs fragment_length >= 1")
        check_fragment_length(request.fragment_length, max_fragment_length)
    if request.max_buffered_steps < 0:
        raise invalid(f"max_buffered_steps must be >= 0, got {request.max_buffered_steps}")
    return mode
