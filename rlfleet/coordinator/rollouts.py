"""Agent and env updates rolled out to every worker, or not at all.

An update goes to every connected worker and the call waits until each has
applied it (AgentReady / EnvReady) or refused it (WorkerError). If one
refuses, some others may already run the new state; sending the previous
state again, as a newer version, brings everyone back to one state without
any worker having to undo anything. Workers are not eligible for work
while they run a state other than the current one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from rlfleet._util.values import json_object
from rlfleet.coordinator.calls import CallScope
from rlfleet.coordinator.failures import CallError, detail_of
from rlfleet.coordinator.registry import WorkerHandle
from rlfleet.coordinator.state import FleetState, UpdateWait
from rlfleet.coordinator.updates import (
    EnvState,
    check_agent_update,
    check_env_update,
    check_pickles,
    whole_agent,
)
from rlfleet.protocol.error_reports import ErrorKind, ErrorReport, describe_report
from rlfleet.protocol.learner_calls import UpdateReceipt
from rlfleet.protocol.multi_agent import MULTI_AGENT_CAPABILITY, can_run_env
from rlfleet.protocol.updates import AgentChange, EnvChange

logger = logging.getLogger("rlfleet.coordinator")

#: Status of an update a worker refused, by the report's kind.
_REFUSAL_CODES: dict[int, grpc.StatusCode] = {
    ErrorKind.POLICY: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.ENV_NOT_FOUND: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.ENV_CONFIG: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.PERMISSION: grpc.StatusCode.PERMISSION_DENIED,
}


@dataclass(frozen=True)
class _Push:
    """An update sent: the workers that must answer, and how to tell they applied it."""

    targets: set[int]
    applied: Callable[[WorkerHandle], bool]
    env_generation: int | None = None
    agent_version: int | None = None


class Rollouts:
    """Applies learners' agent and env updates to the fleet.

    The caller holds the request turn (updates never overlap a Sample
    request), not the lock.

    Args:
        state: The fleet state.
    """

    def __init__(self, state: FleetState) -> None:
        self._state = state

    def update_agent(self, update: AgentChange, scope: CallScope) -> UpdateReceipt:
        """Makes a new agent version and rolls it out.

        Raises:
            CallError: INVALID_ARGUMENT (malformed, or refused by a worker:
                the fleet is then back on the previous agent as a newer
                version), PERMISSION_DENIED (pickled policy),
                DEADLINE_EXCEEDED (workers did not answer in time).
        """
        state = self._state
        check_agent_update(update, state.config.limits)
        with state.lock:
            check_pickles(update, state.config.security.pickle, state.registry)
            previous = state.agent
            # A learner restoring its agent on a restarted coordinator names
            # the version it had: numbering goes on from there, never back.
            version = max(previous.version + 1, update.version)

            def push() -> _Push:
                state.agent = previous.after(update, version)
                targets = state.broadcast(update.renumbered(version))
                return _Push(targets, lambda h: h.agent_version >= version, agent_version=version)

            def pull_back() -> _Push:
                state.agent = dataclasses.replace(previous, version=version + 1)
                targets = state.broadcast(whole_agent(state.agent))
                return _Push(
                    targets, lambda h: h.agent_version >= version + 1, agent_version=version + 1
                )

            workers = self._roll_out(
                push,
                pull_back,
                scope,
                what=f"agent version {version}",
                refused=f"refused agent version {version}",
                restored=f"The fleet is back on the previous agent, now version {version + 1}",
            )
            return self._ack(workers)

    def update_env(self, update: EnvChange, scope: CallScope) -> UpdateReceipt:
        """Makes a new env generation and rolls it out. See :meth:`update_agent`."""
        check_env_update(update)
        state = self._state
        with state.lock:
            check_pickles(update, state.config.security.pickle, state.registry)
            previous = state.env
            if _same_env(previous.update, update):
                # Rebuilding every env to run the same env again only costs:
                # the fleet stays on its generation (and its episode streams).
                on_it = sum(h.env_generation == previous.generation for h in state.registry)
                logger.info(
                    "env update for %r: the fleet already runs it (generation %d); nothing to do",
                    update.env_id,
                    previous.generation,
                )
                return self._ack(on_it)
            if len(state.registry) and not any(
                can_run_env(update.env_id, h.hello.capabilities) for h in state.registry
            ):
                message = (
                    f"env {update.env_id!r} is multi-agent and none of the {len(state.registry)} "
                    f"connected workers declares the capability {MULTI_AGENT_CAPABILITY!r} (the "
                    "Python worker does; the Node worker does not); start Python workers"
                )
                raise CallError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    message,
                    detail_of(ErrorKind.NO_WORKERS, message),
                )
            generation = previous.generation + 1
            fresh = update.renumbered(generation)

            def push() -> _Push:
                targets = self._switch_env(EnvState(fresh))
                return _Push(
                    targets, lambda h: h.env_generation >= generation, env_generation=generation
                )

            def pull_back() -> _Push:
                targets = self._switch_env(previous.renumbered(generation + 1))
                return _Push(
                    targets,
                    lambda h: h.env_generation >= generation + 1,
                    env_generation=generation + 1,
                )

            workers = self._roll_out(
                push,
                pull_back,
                scope,
                what=f"env generation {generation} ({update.env_id})",
                refused=f"could not build env {update.env_id!r}",
                restored=f"The fleet is back on {previous.update.env_id!r}, now generation "
                f"{generation + 1}",
            )
            return self._ack(workers)

    def _switch_env(self, env: EnvState) -> set[int]:
        state = self._state
        state.env = env
        # Cancels go out before the EnvUpdate: workers drop old-env work first.
        state.send_cancels(state.scheduler.set_env_generation(env.generation))
        state.streams.end_episodes()  # workers abandon every stream's episode with their envs
        return state.broadcast(env.update)

    def _roll_out(
        self,
        push: Callable[[], _Push],
        pull_back: Callable[[], _Push],
        scope: CallScope,
        *,
        what: str,
        refused: str,
        restored: str,
    ) -> int:
        """Moves every worker to a new state, or, if one refuses, back to the old one.

        Args:
            push: Installs the new state and sends it; returns who must answer.
            pull_back: Installs the previous state as a newer one and sends it.
            scope: The learner call (its cancellation ends the waits).
            what: The update, for the timeout message.
            refused: What the refusing worker did, for the error message.
            restored: What the fleet runs after a refusal (a sentence).

        Returns:
            How many workers applied the update.

        Raises:
            CallError: The first refusal, or DEADLINE_EXCEEDED.
        """
        pushed = push()
        refusal = self._await(pushed, scope, what)
        if refusal is None:
            logger.info("%s applied by %d workers", what, len(pushed.targets))
            return len(pushed.targets)
        back = pull_back()
        self._await(back, scope, "", quiet=True)
        self._retire_refusals(pushed, back)
        worker, detail = refusal
        raise CallError(
            _REFUSAL_CODES.get(detail.kind, grpc.StatusCode.FAILED_PRECONDITION),
            f"worker {worker!r} {refused}: {describe_report(detail)}. {restored}",
            detail,
        )

    def _retire_refusals(self, pushed: _Push, back: _Push) -> None:
        """Clears the refusals of a rolled-back update from the workers' last errors.

        The learner's call gets the refusal; a worker that is back on the
        previous state has nothing wrong left to show in ``status``.
        """
        for handle in self._state.registry:
            error = handle.last_error
            if error is None or not back.applied(handle):
                continue
            if (
                pushed.env_generation is not None and error.env_generation == pushed.env_generation
            ) or (pushed.agent_version is not None and error.agent_version == pushed.agent_version):
                handle.last_error = None

    def _await(
        self, pushed: _Push, scope: CallScope, what: str, *, quiet: bool = False
    ) -> tuple[str, ErrorReport] | None:
        """Waits until every target applied an update or refused it.

        Returns:
            (worker name, error) of the first refusal, or None.

        Raises:
            CallError: DEADLINE_EXCEEDED naming the workers that did not
                answer in time (unless ``quiet``).
        """
        state = self._state
        wait = UpdateWait(
            set(pushed.targets),
            env_generation=pushed.env_generation,
            agent_version=pushed.agent_version,
        )
        state.update_wait = wait

        def pending() -> list[WorkerHandle]:
            handles = (state.registry.get(worker_id) for worker_id in wait.targets)
            return [
                h
                for h in handles
                if h is not None
                and h.alive
                and h.worker_id not in wait.errors
                and not pushed.applied(h)
            ]

        timeout = state.config.update_timeout_seconds
        try:
            done = state.wait(lambda: not pending(), timeout, scope)
        finally:
            state.update_wait = None
        if wait.errors:
            worker_id, detail = next(iter(wait.errors.items()))
            handle = state.registry.get(worker_id)
            return (handle.name if handle else detail.worker), detail
        if not done and not quiet:
            names = sorted(h.name for h in pending())
            raise CallError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"workers {names} did not apply {what} within {timeout:g} seconds "
                "(--update-timeout); they get no work until they do",
            )
        return None

    def _ack(self, workers: int) -> UpdateReceipt:
        state = self._state
        return UpdateReceipt(
            agent_version=state.agent.version,
            env_generation=state.env.generation,
            workers_updated=workers,
            coordinator_id=state.coordinator_id,
        )


def _same_env(current: EnvChange, update: EnvChange) -> bool:
    """Whether an update asks for the env the fleet runs (pickled factories never are)."""
    if update.pickled_env_factory or current.pickled_env_factory:
        return False
    if update.env_id != current.env_id:
        return False
    if update.max_episode_length != current.max_episode_length:
        return False
    if update.vectorization != current.vectorization:
        return False
    # Text may differ in spacing or key order for the same kwargs.
    where = "EnvUpdate.kwargs_json"
    return json_object(update.kwargs_json, where) == json_object(current.kwargs_json, where)
