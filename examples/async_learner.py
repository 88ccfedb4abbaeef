"""An asynchronous learner: train on experience as it streams in from the fleet.

    python examples/async_learner.py      # with rlfleet installed (pip install -e .)

Instead of asking for a batch and waiting (``obtain_samples``), the learner
subscribes to a stream that the workers fill continuously with the latest
agent version. Once it holds ``BATCHES_PER_UPDATE`` streamed batches and
``MIN_STEPS_PER_UPDATE`` steps, it trains and pushes the new parameters
with ``update_agent``; the workers switch at once, so sampling and learning
overlap.

Why fragments and not whole episodes: an agent update aborts the episodes
in flight (so that every episode comes from one version). With updates every
few thousand steps, long episodes would rarely finish and the batches would
over-represent short ones, biasing the gradient. Fragment streams instead
keep every env running across updates and cut it into fixed-length pieces;
a piece cut mid-episode ends with a MID step, from whose last observation
VPG bootstraps the value.

Each streamed batch names the agent version that produced it. VPG is
on-policy, so batches more than ``MAX_LAG`` versions old are dropped.
"""

from __future__ import annotations

import collections
import sys

import numpy as np

from rlfleet.client import Fleet
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.step_type import StepType
from rlfleet.envs.config import EnvConfig
from rlfleet.learners import VPG

FRAGMENT_LENGTH = 64
MIN_STEPS_PER_UPDATE = 4000
BATCHES_PER_UPDATE = 4
MAX_LAG = 1  # accept batches of the current and the previous version
TARGET_RETURN = 475.0
MAX_UPDATES = 200


class EpisodeReturns:
    """Adds up the pieces of each episode across fragments, for monitoring.

    A piece is identified by its stream (env slot of the fleet) and its
    episode index within that stream; pieces of one episode arrive in order.
    """

    def __init__(self) -> None:
        self._partial: dict[tuple[int, int], float] = {}
        self.finished: list[float] = []

    def add(self, batch: EpisodeBatch) -> None:
        starts = np.cumsum(batch.lengths) - batch.lengths
        sums = np.add.reduceat(batch.rewards, starts)
        ends = batch.step_types[starts + batch.lengths - 1]
        infos = batch.episode_infos
        for stream, episode, piece, end in zip(
            infos["stream"].tolist(), infos["episode_index"].tolist(), sums, ends, strict=True
        ):
            key = (stream, episode)
            total = self._partial.pop(key, 0.0) + float(piece)
            if end in (StepType.TERMINAL, StepType.TIMEOUT):
                self.finished.append(total)
            else:
                self._partial[key] = total

    def take(self) -> list[float]:
        """Returns of the episodes finished since the last call."""
        finished, self.finished = self.finished, []
        return finished


def main() -> int:
    env = EnvConfig("CartPole-v1")
    vpg = VPG(env.env_spec(), seed=0)
    with Fleet.local(
        workers=2, envs_per_worker=4, env=env, policy=vpg.policy_spec, seed=0
    ) as sampler:
        version = sampler.update_agent(vpg.get_params())
        pending: list[EpisodeBatch] = []
        steps_by_version: collections.Counter[int] = collections.Counter()
        returns = EpisodeReturns()
        updates = dropped = 0
        # A small buffer keeps the workers at most one update ahead of the
        # learner (backpressure), so little of what they sample goes stale.
        with sampler.stream(
            mode="fragments",
            fragment_length=FRAGMENT_LENGTH,
            max_buffered_steps=MIN_STEPS_PER_UPDATE,
        ) as stream:
            for batch, batch_version in stream:
                returns.add(batch)
                if batch_version < version - MAX_LAG:
                    dropped += batch.total_steps
                    continue
                pending.append(batch)
                steps_by_version[batch_version] += batch.total_steps
                steps = sum(b.total_steps for b in pending)
                if len(pending) < BATCHES_PER_UPDATE or steps < MIN_STEPS_PER_UPDATE:
                    continue

                vpg.train_step(EpisodeBatch.concatenate(*pending))
                version = sampler.update_agent(vpg.get_params())
                updates += 1
                finished = returns.take()
                average = float(np.mean(finished)) if finished else float("nan")
                versions = ", ".join(f"v{v}: {n}" for v, n in sorted(steps_by_version.items()))
                print(
                    f"update {updates:3d}  average return {average:6.1f} "
                    f"({len(finished):3d} episodes)  trained on steps by version "
                    f"[{versions}], {dropped} stale dropped  -> pushed v{version}"
                )
                pending.clear()
                steps_by_version.clear()
                dropped = 0
                if average >= TARGET_RETURN:
                    print(f"solved after {updates} updates")
                    return 0
                if updates >= MAX_UPDATES:
                    break
    print(f"not solved in {MAX_UPDATES} updates", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
