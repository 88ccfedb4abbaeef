"""PettingZoo envs registered for the fleet (``--import rlfleet.rllib.pettingzoo_envs``).

- ``multi-agent/simple_spread-v3``: mpe2's cooperative ``simple_spread``
  (3 agents, discrete actions; kwargs go to ``parallel_env``);
- ``multi-agent/rps-v2``: PettingZoo's classic rock-paper-scissors, an AEC
  env served through PettingZoo's ``aec_to_parallel``.

Needs ``pettingzoo`` and ``mpe2`` (``pip install rlfleet[multiagent]``).
"""

from __future__ import annotations

from typing import Any

from rlfleet.rllib.multi_agent import register_multi_agent_env


def _simple_spread(**kwargs: Any) -> Any:
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(**kwargs)


def _rps(**kwargs: Any) -> Any:
    from pettingzoo.classic import rps_v2

    return rps_v2.env(**kwargs)


SIMPLE_SPREAD = register_multi_agent_env("simple_spread-v3", _simple_spread)
RPS = register_multi_agent_env("rps-v2", _rps)
