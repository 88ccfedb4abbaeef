"""Failure and restart handling of the engine's env slots.

An env that raises in ``reset`` or ``step`` is marked broken and rebuilt
before its slot's next segment, within the worker's restart budget
(:class:`~rlfleet.worker._restarts.RestartLedger`); past it, or when the
env cannot be rebuilt, an :class:`~rlfleet.errors.EnvError` is queued and
raised after the vector step (:meth:`SlotFailures.raise_deferred`), so
the other slots' step still counts. A non-finite observation in
``"error"`` mode, or one outside the env's space, drops its segment the same
way, and a policy that fails on a non-finite one is reported with the
observation as the root cause.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable

import numpy as np

from rlfleet.errors import EnvError
from rlfleet.worker._checks import nonfinite_rows
from rlfleet.worker._restarts import RestartLedger
from rlfleet.worker._segments import Live

logger = logging.getLogger("rlfleet.worker")


class SlotFailures:
    """The broken slots, the restart budget and the errors queued in a vector step.

    Args:
        name: Names the worker in errors.
        ledger: The restart budget, shared by all slots.
        nan_mode: ``"error"``, ``"flag"`` or ``"ignore"`` (see VecWorker).
    """

    def __init__(self, *, name: str, ledger: RestartLedger, nan_mode: str) -> None:
        self.name = name
        self.ledger = ledger
        self.nan_mode = nan_mode
        #: Slots whose env crashed: rebuilt before their next episode.
        self.broken: set[int] = set()
        #: Errors of this vector step, raised after it (:meth:`raise_deferred`).
        self.errors: list[EnvError] = []

    def restart(
        self,
        slot: int,
        exc: Exception,
        call: str,
        live: Live,
        *,
        step: int,
        rebuildable: bool,
        source_name: str,
    ) -> bool:
        """Marks a failed env for rebuilding; True if it may be, else queues an EnvError."""
        self.broken.add(slot)
        if rebuildable and self.ledger.try_restart():
            logger.warning(
                "worker %s: env %d (%s) raised %s: %s in %s of %s; rebuilding it and "
                "re-running (%d restarts so far)",
                self.name,
                slot,
                source_name,
                type(exc).__name__,
                exc,
                call,
                live.describe(),
                self.ledger.total,
            )
            return True
        why = (
            self.ledger.describe()
            if rebuildable
            else "the env was given as an instance and cannot be rebuilt"
        )
        self.errors.append(
            EnvError(
                f"env {source_name} raised {type(exc).__name__}: {exc} in {call} of "
                f"{live.describe()}; not restarted ({why})",
                worker=self.name,
                env_index=slot,
                step=step,
                episode_index=live.episode_index,
                remote_traceback="".join(traceback.format_exception(exc)),
            )
        )
        return False

    def native_failed(
        self, exc: Exception, lives: list[tuple[int, Live]], s: int, source_name: str
    ) -> None:
        """Queues the error of a native env's failed step, which lost every live segment."""
        first_slot, first = lives[0]
        self.errors.append(
            EnvError(
                f"native vector env {source_name} raised {type(exc).__name__}: {exc} in "
                f"step; the {len(lives)} episodes in flight were dropped (native envs are "
                "not restarted one by one; the whole env is reset before the next episode)",
                worker=self.name,
                env_index=first_slot,
                step=first.offset + s - first.seg_start + 1,
                episode_index=first.episode_index,
                remote_traceback="".join(traceback.format_exception(exc)),
            )
        )

    def drop_segment(self, slot: int, live: Live, message: str, step: int) -> None:
        """Queues the EnvError of a segment dropped for what ``message`` says."""
        self.errors.append(
            EnvError(
                message,
                worker=self.name,
                env_index=slot,
                step=step,
                episode_index=live.episode_index,
            )
        )

    def reject_nonfinite(
        self, slot: int, live: Live, step: int, why: str, source_name: str
    ) -> None:
        """Queues the EnvError of a segment dropped for a non-finite observation."""
        returned_by = "reset" if step == 0 else f"step {step}"
        self.errors.append(
            EnvError(
                f"env {source_name} returned a non-finite observation (NaN or inf) "
                f"from {returned_by} of {live.describe()}{why}; the episode was dropped. "
                "Fix the env, or create the worker with nan_observations='flag' or 'ignore'",
                worker=self.name,
                env_index=slot,
                step=step,
                episode_index=live.episode_index,
            )
        )

    def raise_policy_failure(
        self,
        exc: Exception,
        observations: np.ndarray,
        slots: list[int],
        drop: Callable[[int], Live],
        *,
        step_count: int,
        source_name: str,
    ) -> None:
        """Reports a non-finite observation as the root cause of a policy failure.

        In ``"error"`` mode, the slot's segment is dropped and EnvError raised.

        Args:
            exc: What the policy raised.
            observations: The policy's batch.
            slots: The slot of each row of the batch.
            drop: Takes a slot's live segment off it.
            step_count: The engine's current vector step.
            source_name: The env's name, for messages.
        """
        if self.nan_mode != "error":
            return
        bad = nonfinite_rows(np.asarray(observations))
        if not bad.any():
            return
        slot = slots[int(np.argmax(bad))]
        live = drop(slot)
        step = live.offset + step_count - live.seg_start
        self.reject_nonfinite(
            slot,
            live,
            step,
            f", and the policy failed on it ({type(exc).__name__}: {exc})",
            source_name,
        )
        error = self.errors.pop()
        raise error from exc

    def raise_native_policy_failure(
        self,
        exc: Exception,
        observations: np.ndarray,
        running: np.ndarray,
        drop: Callable[[int], Live],
        *,
        step_count: int,
        source_name: str,
    ) -> None:
        """:meth:`raise_policy_failure` for a native step, whose rows include idle slots.

        Only a running slot's non-finite observation drops an episode; one
        of an idle slot (stepped unrecorded) is named in a note.
        """
        bad = nonfinite_rows(observations)
        unseen = np.flatnonzero(bad & ~running)
        if len(unseen):
            exc.add_note(
                f"native env {source_name}: slots {unseen[:8].tolist()} "
                "returned non-finite observations while no episode was recorded on them (row i "
                "of the policy's batch is slot i)"
            )
        rows = running.reshape((len(running),) + (1,) * (observations.ndim - 1))
        zero = np.zeros((), dtype=observations.dtype)
        self.raise_policy_failure(
            exc,
            np.where(rows, observations, zero),
            list(range(len(running))),
            drop,
            step_count=step_count,
            source_name=source_name,
        )

    def raise_deferred(self) -> None:
        """Raises the first queued EnvError (noting the others), if any."""
        if not self.errors:
            return
        first, *rest = self.errors
        self.errors = []
        for other in rest:
            first.add_note(f"also in the same step: {str(other).splitlines()[0]}")
        raise first
