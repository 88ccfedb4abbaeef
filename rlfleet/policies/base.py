"""The Policy interface every worker runs.

A policy maps a batch of observations to a batch of actions plus
``agent_infos`` (a dict of arrays with one row per observation).

Determinism: a worker steps several episodes together with one batched call,
but each episode must get the same actions whichever slot or worker runs it.
So ``get_actions`` takes one random generator per row (the episode's own,
seeded from its policy seed) and must compute each row's distribution with
arithmetic that does not depend on the other rows (a plain BLAS ``x @ w``
rounds a row differently with the batch size: docs/policies.md, "Your own
policy class").

A policy whose rows each draw a fixed number of values of one kind per call
(the built-in MLPs) may say so with :meth:`Policy.row_draws`; a worker then
draws each episode's values a block at a time and calls
:meth:`Policy.get_actions_from_draws` with the values the generators would
have given, which is cheaper than one generator call per row per step.

A worker on a native vector env keeps no layout-independent batches (its
env's episodes depend on the slot layout already), so it calls
``get_actions_batched`` instead: every row draws from one generator, in row
order, and a policy may use a plain batched matmul (docs/policies.md,
"Native vector-env workers").
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import ConfigError, PolicyError
from rlfleet.policies._observations import batch_size

AgentInfos = dict[str, np.ndarray]
ParamDict = dict[str, np.ndarray]

#: Generator methods a policy's per-row draws may come from.
DRAW_KINDS = ("random", "standard_normal")


@dataclass(frozen=True)
class RowDraws:
    """What ``get_actions`` draws from each row's generator per call.

    Attributes:
        kind: The generator method: ``"random"`` or ``"standard_normal"``.
        count: Values drawn per row per call (``rng.random()`` ``count``
            times, or ``rng.standard_normal(count)``).

    Raises:
        ConfigError: If the kind is unknown or the count is not a positive int.
    """

    kind: Literal["random", "standard_normal"]
    count: int

    def __post_init__(self) -> None:
        if self.kind not in DRAW_KINDS:
            raise ConfigError(f"RowDraws kind must be one of {DRAW_KINDS}, got {self.kind!r}")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ConfigError(f"RowDraws count must be a positive int, got {self.count!r}")


class Policy(abc.ABC):
    """Base class of rlfleet policies.

    Subclasses implement :meth:`get_actions` and, if they have parameters,
    :meth:`get_param_values` / :meth:`set_param_values`.

    Args:
        env_spec: The spaces the policy acts in.
        seed: Seed of the policy's own generator (used when ``get_actions``
            is called without per-row generators).
        deterministic: If True, act with the mode of the distribution (argmax
            for categorical, mean for Gaussian) instead of sampling.
    """

    def __init__(
        self, env_spec: EnvSpec, *, seed: int | None = None, deterministic: bool = False
    ) -> None:
        self.env_spec = env_spec
        self.deterministic = deterministic
        self.rng = np.random.default_rng(seed)

    def seed(self, seed: int | None) -> None:
        """Reseeds the policy's own generator."""
        self.rng = np.random.default_rng(seed)

    @abc.abstractmethod
    def get_actions(
        self,
        observations: Any,
        rngs: Sequence[np.random.Generator] | None = None,
    ) -> tuple[np.ndarray, AgentInfos]:
        """Computes actions for a batch of observations.

        Args:
            observations: Batched observations, leading dimension N.
            rngs: One generator per row, or None to use ``self.rng`` for all.

        Returns:
            Actions with leading dimension N, and agent_infos: a dict of
            arrays with leading dimension N.
        """

    def row_draws(self) -> RowDraws | None:
        """What each row draws from its generator per call, if always the same.

        A worker reads this when the policy is installed. If it is not None,
        the worker may call :meth:`get_actions_from_draws` instead of
        :meth:`get_actions`, with each row's values drawn ahead from that
        row's generator (numpy gives the same values for ``random(n)`` as
        for n ``random()`` calls, and likewise for ``standard_normal``).
        None (the default) means the policy always gets generators.
        """
        return None

    def get_actions_from_draws(
        self, observations: Any, draws: np.ndarray
    ) -> tuple[np.ndarray, AgentInfos]:
        """``get_actions`` with each row's draws given instead of its generator.

        Only called when :meth:`row_draws` is not None; must return exactly
        what ``get_actions(observations, rngs)`` returns when ``draws[i]`` are
        the values ``rngs[i]`` would give.

        Args:
            observations: Batched observations, leading dimension N.
            draws: Float64 array (N, ``row_draws().count``).

        Raises:
            PolicyError: If the policy does not declare its draws.
        """
        raise PolicyError(
            f"{type(self).__name__} does not declare its per-row draws (row_draws() is None); "
            "call get_actions with one generator per row"
        )

    def get_actions_batched(
        self, observations: Any, generator: np.random.Generator
    ) -> tuple[np.ndarray, AgentInfos]:
        """Computes actions for a batch whose rows all draw from one generator.

        Native vector-env workers call this (docs/policies.md, "Native
        vector-env workers"): the batch is reproducible for the same
        generator state and the same observations, but a row's action may
        depend on the other rows. This default is ``get_actions`` with
        ``generator`` for every row, so row i takes the i-th draws of the
        call; the built-in MLPs override it with one vectorised draw (their
        rows do not depend on the batch, so the bits are the same).

        Args:
            observations: Batched observations, leading dimension N.
            generator: The one generator every row draws from, in row order.

        Returns:
            Actions with leading dimension N, and agent_infos: a dict of
            arrays with leading dimension N.
        """
        n = batch_size(observations, self.env_spec.observation_space, type(self).__name__)
        return self.get_actions(observations, [generator] * n)

    def get_action(self, observation: Any) -> tuple[np.ndarray, AgentInfos]:
        """Computes the action for one observation.

        Returns:
            The action and agent_infos for that single observation (no
            leading batch dimension).
        """
        batched = _add_batch_dim(observation)
        actions, infos = self.get_actions(batched, [self.rng])
        return actions[0], {k: v[0] for k, v in infos.items()}

    def reset(self, do_resets: Sequence[bool] | np.ndarray | None = None) -> None:
        """Resets per-episode state (recurrent policies). Stateless by default.

        Args:
            do_resets: Which rows to reset; None means all.
        """
        del do_resets

    def get_param_values(self) -> ParamDict:
        """Returns the parameters as named arrays (copies). Empty by default."""
        return {}

    def set_param_values(self, params: Mapping[str, np.ndarray]) -> None:
        """Sets the parameters from named arrays.

        Raises:
            PolicyError: If names, shapes or dtypes do not match; nothing is
                changed in that case.
        """
        from rlfleet.errors import PolicyError

        if params:
            raise PolicyError(f"{type(self).__name__} has no parameters, got {sorted(params)}")


def _add_batch_dim(observation: Any) -> Any:
    if isinstance(observation, dict):
        return {k: _add_batch_dim(v) for k, v in observation.items()}
    if isinstance(observation, tuple):
        return tuple(_add_batch_dim(v) for v in observation)
    return np.asarray(observation)[None]
