"""How a sampling request runs and how it ended, in rlfleet's own types.

Shared by every side: the coordinator's scheduler, the local sampler, the
client, the worker and the conformance kit. :class:`Mode`'s values are the
wire's ``SampleMode`` numbers; :class:`Footer` becomes a ``SampleFooter``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Mode(enum.IntEnum):
    """Sampling modes; values are the wire's ``SampleMode`` numbers."""

    STEPS = 1
    EPISODES = 2
    FRAGMENTS = 3


@dataclass(frozen=True)
class Footer:
    """How a finished Sample request ended (becomes a ``SampleFooter``).

    ``data_results``: the answer's result messages sent on the learner's
    results connection (0: none, all on the call's stream).
    """

    num_episodes: int
    total_steps: int
    workers_used: int
    reassigned_units: int
    data_results: int = 0
