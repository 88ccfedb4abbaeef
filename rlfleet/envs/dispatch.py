"""How a vector env's commands reach a backend and come back: the in-flight bookkeeping.

:class:`CommandDispatch` is the part of :class:`~rlfleet.envs.BaseVectorEnv`
that talks to a backend's :meth:`~CommandDispatch._send`/:meth:`~CommandDispatch._receive`:
which envs have a command in flight, which answers are stale (their call
was interrupted) or undelivered (an async step raised another env's
failure), and tianshou's ``wait_num``/``timeout`` collection of ready steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlfleet.envs.commands import FailedCall
from rlfleet.errors import UsageError


class CommandDispatch:
    """Sends commands to a backend's envs and collects their answers.

    Attributes:
        env_num: Number of envs.
        wait_num: How many envs an async step waits for.
        timeout: Seconds an async step waits for ``wait_num`` envs (None: no limit).
    """

    env_num: int
    wait_num: int
    timeout: float | None

    def _init_dispatch(self, env_num: int) -> None:
        # Which envs must be reset before a step (never reset, episode ended, call failed).
        self._needs_reset = np.ones(env_num, dtype=bool)
        # A command was sent and its answer not yet received from the backend.
        # Sets, not bool arrays: a step touches a few envs, and a numpy op on a
        # small array costs about 1 us where a set operation costs 0.1.
        self._in_flight: set[int] = set()
        # In flight, but the call that sent it was interrupted: the answer is
        # discarded when it comes (the caller was told by the interruption).
        self._stale: set[int] = set()
        # Step answers received but not yet returned (an async step raised
        # another env's failure, or was interrupted, after receiving them).
        self._undelivered: dict[int, Any] = {}

    # --- the backend contract ------------------------------------------------

    def _send(self, ids: list[int], command: str, args: Sequence[Any]) -> None:
        """Starts ``command`` with ``args[k]`` on env ``ids[k]`` for every k, without waiting.

        For a step, ``args`` may be the caller's action array itself (its
        rows are the actions): read or copy what is needed before returning,
        as the caller may reuse the array afterwards.

        None of ``ids`` has a command in flight; other envs may (async mode,
        or :meth:`step_and_reset`, which sends two commands to disjoint envs
        before receiving). Every env of ``ids`` must then answer exactly once
        through :meth:`_receive`: a failure to send (the env is gone, the
        argument cannot be encoded) is answered with a :class:`FailedCall`,
        not raised. Only an interruption (e.g. KeyboardInterrupt) may
        propagate; the backend then makes sure no env of ``ids`` answers
        later.

        Not abstract: a tianshou-style subclass that overrides the public
        methods (``step``, ``reset``, ``seed``, ...) needs neither of these;
        calling a public method it did not override then raises this.

        Raises:
            UsageError: Naming the method to implement (this base's answer).
        """
        raise UsageError(
            f"{type(self).__name__} cannot run {command}(): it implements neither "
            f"{command}() itself (a tianshou-style subclass overrides the public methods) "
            "nor _send()/_receive() (a backend's two methods; docs/vector_env.md, "
            '"Writing a backend")'
        )

    def _receive(self, ids: list[int], count: int, timeout: float | None) -> dict[int, Any]:
        """Collects the answers of envs ``ids``, each of which has one command in flight.

        Returns when at least ``count`` of them have answered, with every
        answer available by then; or when ``timeout`` seconds (None: no
        limit) have passed, with the answers so far (possibly none). An
        answer is the env's result, or a :class:`FailedCall` if it raised,
        died, or passed the backend's own per-call deadline (which must end
        the wait even when ``timeout`` is None).

        It may be interrupted (e.g. KeyboardInterrupt); the answers it had
        collected by then must come from a later call.

        Returns:
            ``{env index: answer}`` for the envs that answered.
        """
        raise UsageError(f"{type(self).__name__} implements _send() but not _receive()")

    # --- dispatching ----------------------------------------------------------

    def _check_idle(self, ids: list[int], call: str) -> None:
        """Refuses envs whose async step has not been returned yet."""
        busy = []
        in_flight = self._in_flight
        if in_flight:  # else (sync mode, between calls) none is busy
            busy = [i for i in ids if i in in_flight and i not in self._stale]
        if self._undelivered:
            busy += [i for i in ids if i in self._undelivered]
        if busy:
            raise UsageError(
                f"{call}(): envs {sorted(busy)} have a step in flight (async mode); "
                "call step() without them until it returns them"
            )

    def _start(self, ids: list[int], command: str, args: Sequence[Any]) -> None:
        """Discards stale answers of ``ids``, then sends them ``command``."""
        stale = [i for i in ids if i in self._stale] if self._stale else []
        while stale:
            for i in self._receive(stale, len(stale), None):
                self._in_flight.discard(i)
                self._stale.discard(i)
            stale = [i for i in stale if i in self._stale]
        try:
            self._send(ids, command, args)
        except BaseException:
            self._needs_reset[ids] = True
            raise
        self._in_flight.update(ids)

    def _call(self, ids: list[int], command: str, args: Sequence[Any]) -> list[Any]:
        """Runs ``command`` on ``ids`` and waits for all of them (see :meth:`_call_many`)."""
        return self._call_many([(ids, command, args)])[0]

    def _call_many(
        self, batches: Sequence[tuple[list[int], str, Sequence[Any]]]
    ) -> list[list[Any]]:
        """Starts every batch (disjoint ids), then waits for every env of all of them.

        Returns:
            Each batch's answers, in its ids' order.

        Raises:
            Exception: The first failure (batches and ids in order), after
                every env answered.
        """
        answers = self._wait_all(batches)
        for batch_ids, _, _ in batches:
            for i in batch_ids:
                if isinstance(answers[i], FailedCall):
                    raise answers[i].error
        return [[answers[i] for i in batch_ids] for batch_ids, _, _ in batches]

    def _wait_all(self, batches: Sequence[tuple[list[int], str, Sequence[Any]]]) -> dict[int, Any]:
        """:meth:`_call_many` without raising: every env's answer, a FailedCall if it failed."""
        ids = [i for batch_ids, _, _ in batches for i in batch_ids]
        started: list[int] = []
        try:
            for batch_ids, command, args in batches:
                if batch_ids:
                    self._start(batch_ids, command, args)
                    started += batch_ids
        except BaseException:
            # Those already sent answer later; that answer is nobody's.
            self._stale.update(started)
            raise
        answers: dict[int, Any] = {}
        try:
            while len(answers) < len(ids):
                rest = [i for i in ids if i not in answers]
                answers.update(self._receive(rest, len(rest), None))
        finally:
            if len(answers) == len(ids):
                self._in_flight.difference_update(ids)
            else:
                for i in ids:
                    if i in answers:
                        self._in_flight.discard(i)
                    else:
                        self._stale.add(i)
        return answers

    def _collect_ready(self) -> tuple[list[int], list[Any]]:
        """Waits for the first ready async steps (tianshou's ``wait_num``/``timeout``).

        Returns:
            The ready env indices, ascending, and their step results.
        """
        ready = self._undelivered
        self._undelivered = {}
        busy = sorted(self._in_flight - self._stale if self._stale else self._in_flight)
        waiting = [i for i in busy if i not in ready] if ready else busy
        if not waiting and not ready:
            raise UsageError("step(): no env was stepped and none has a step in flight")
        try:
            need = min(self.wait_num, len(waiting) + len(ready)) - len(ready)
            if need > 0:
                got = self._receive(waiting, need, self.timeout)
                self._in_flight.difference_update(got)
                ready.update(got)
            while not ready:
                got = self._receive(waiting, 1, None)
                self._in_flight.difference_update(got)
                ready.update(got)
        except BaseException:
            self._undelivered = ready
            raise
        ids = sorted(ready)
        failed = [i for i in ids if isinstance(ready[i], FailedCall)]
        if failed:
            # The other answers (other failures too) come from the next step().
            self._undelivered = {i: ready[i] for i in ids if i != failed[0]}
            raise ready[failed[0]].error
        return ids, [ready[i] for i in ids]


__all__ = ["CommandDispatch"]
