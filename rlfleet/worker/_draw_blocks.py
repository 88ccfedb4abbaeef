"""Each slot's policy draws, taken from its episode's generator a block at a time.

A policy that declares its per-row draws (:meth:`Policy.row_draws`) gets
them from here instead of one generator call per row per step: when a
segment starts on a slot, the slot's next ``size`` steps of draws are drawn
in one call, and every vector step takes all slots' draws with one
indexing. numpy's generators give the same values for ``random(n)`` as for
n ``random()`` calls (and likewise for ``standard_normal``), so the policy
sees exactly the values the per-row calls would have given
(docs/policies.md; ``tests/test_draw_blocks.py``).

The generator runs ahead of the episode by the unused part of its block.
That is harmless for an episode that ends (its generator is not used
again), and :meth:`DrawBlocks.rewind` puts it back where the per-step draws
would have left it for an episode that continues later (a fragment stream
parked at a window's end).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlfleet.policies.base import RowDraws

#: Vector steps of draws taken per block: an episode of CartPole's early
#: length takes one block; longer ones refill every this many steps.
BLOCK_STEPS = 64


class DrawBlocks:
    """Time-major blocks of every slot's next draws.

    Row ``step % size`` holds, for each slot, the draws of vector step
    ``step`` (like the step ring), so one step's draws of all slots are one
    view.

    Args:
        n_envs: Number of slots.
        draws: What the policy draws per row per call.
        size: Vector steps per block.
    """

    def __init__(self, n_envs: int, draws: RowDraws, size: int = BLOCK_STEPS) -> None:
        self.size = size
        self._count = draws.count
        self._normal = draws.kind == "standard_normal"
        self._values = np.zeros((size, n_envs, draws.count), dtype=np.float64)
        self._rngs: list[np.random.Generator | None] = [None] * n_envs
        # The step at which each slot's block runs out, and the slots due at a step
        # (entries of slots that started again since are stale and skipped).
        self._due = [-1] * n_envs
        self._refills: dict[int, list[int]] = {}

    def start(self, slot: int, rng: np.random.Generator, step: int) -> None:
        """Draws the slot's values for vector steps ``step .. step + size - 1`` from ``rng``."""
        self._rngs[slot] = rng
        self._fill(slot, step)

    def stop(self, slot: int) -> None:
        """The slot's segment ended: its generator is not drawn again."""
        self._rngs[slot] = None
        self._due[slot] = -1

    def take(self, step: int, cols: np.ndarray | None) -> np.ndarray:
        """The draws of vector step ``step``: (slots, count), all slots or ``cols``."""
        due = self._refills.pop(step, None)
        if due is not None:
            for slot in due:
                if self._due[slot] == step:
                    self._fill(slot, step)
        row = self._values[step % self.size]
        return row if cols is None else row[cols]

    def rewind(self, rng: np.random.Generator, state: Mapping[str, Any], steps: int) -> None:
        """Puts ``rng`` where ``steps`` per-step draws from ``state`` leave it.

        Args:
            rng: A segment's generator, run ahead by its blocks.
            state: Its ``bit_generator.state`` when the segment started.
            steps: Vector steps the segment took.
        """
        rng.bit_generator.state = state
        self._draw(rng, steps * self._count)

    def _fill(self, slot: int, step: int) -> None:
        rng = self._rngs[slot]
        assert rng is not None
        size = self.size
        values = self._draw(rng, size * self._count).reshape(size, self._count)
        first = step % size
        # Rows first .. size - 1 take steps step ..; rows 0 .. first - 1 the rest.
        self._values[first:, slot] = values[: size - first]
        self._values[:first, slot] = values[size - first :]
        self._due[slot] = step + size
        self._refills.setdefault(step + size, []).append(slot)

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.standard_normal(n) if self._normal else rng.random(n)
