"""What a lease of pickled factories carries beyond arrays and JSON.

``RemoteVectorEnv(env_fns)`` on a fleet that takes code (here an embedded
fleet: real worker processes over loopback) carries what tianshou's
``RayVectorEnv`` carries: objects in infos, attributes and return values
that are objects, Dict observations, and envs whose spaces differ within
one lease, each as the env gives it (the same as ``DummyVectorEnv``). A
lease of an env id carries none of it, and says how to opt in.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest

from rlfleet.client import Fleet, RemoteVectorEnv
from rlfleet.coordinator.leases.translation import lease_response, relay_reply
from rlfleet.envs import DummyVectorEnv, EnvConfig
from rlfleet.errors import ConfigError, ProtocolError, UsageError
from rlfleet.security.pickle import dumps
from rlfleet.wire.lease_values import ReplyCheck
from rlfleet.wire.leases import (
    LeaseAnswer,
    LeaseAnswers,
    decode_lease_response,
    lease_report_message,
)

# The envs below travel by value, so workers need not import this module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TESTING = ("rlfleet.envs.testing",)


@dataclass
class Tag:
    """An object no JSON carries."""

    index: int


class Walker(gym.Env):
    """tianshou's test env (MoveToRightEnv) in short: it puts itself into its
    infos, its observation space depends on its size, and with ``nested`` it
    observes a Dict holding a Tuple."""

    def __init__(self, size: int, nested: bool = False) -> None:
        self.size = size
        self.nested = nested
        self.index = 0
        box = gym.spaces.Box(0, size, (1,), np.float32)
        pair = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(0, 1, (2,), np.float64)))
        self.observation_space: gym.Space = (
            gym.spaces.Dict({"index": box, "more": gym.spaces.Dict({"pair": pair})})
            if nested
            else box
        )
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self) -> Any:
        index = np.array([self.index], np.float32)
        if not self.nested:
            return index
        return {"index": index, "more": {"pair": (1, self.np_random.random(2))}}

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.index = 0
        return self._obs(), {"env": self, "key": 1}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.index = self.index + 1 if action == 1 else max(self.index - 1, 0)
        done = self.index >= self.size
        return self._obs(), float(done), done, False, {"env": self, "tag": Tag(self.index)}

    def tag(self) -> Tag:
        return Tag(self.index)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    fleet = Fleet.local(workers=2, envs_per_worker=4, imports=TESTING)
    try:
        yield fleet
    finally:
        fleet.close()


def _assert_same(got: Any, want: Any) -> None:
    """Equal values of equal types, through dicts, tuples and object arrays."""
    assert type(got) is type(want), (got, want)
    if isinstance(want, dict):
        assert list(got) == list(want)
        for key in want:
            _assert_same(got[key], want[key])
    elif isinstance(want, tuple | list):
        assert len(got) == len(want)
        for mine, theirs in zip(got, want, strict=True):
            _assert_same(mine, theirs)
    elif isinstance(want, np.ndarray) and want.dtype == object:
        assert got.shape == want.shape
        for mine, theirs in zip(got.flat, want.flat, strict=True):
            _assert_same(mine, theirs)
    else:
        assert np.asarray(got).dtype == np.asarray(want).dtype
        np.testing.assert_array_equal(got, want)


def _both(env_fns: list[Callable[[], Any]], fleet: Fleet) -> tuple[DummyVectorEnv, RemoteVectorEnv]:
    return DummyVectorEnv(env_fns), RemoteVectorEnv(env_fns, on=fleet)


def test_objects_in_infos_attributes_and_return_values_travel_pickled(fleet: Fleet) -> None:
    local, remote = _both([partial(Walker, s) for s in (3, 4)], fleet)
    with local, remote:
        (local_obs, _), (obs, infos) = local.reset(seed=5), remote.reset(seed=5)
        assert [type(i["env"]).__name__ for i in infos] == ["Walker", "Walker"]
        assert [i["env"].size for i in infos] == [3, 4]  # each env's own copy
        assert [i["key"] for i in infos] == [1, 1] and [i["env_id"] for i in infos] == [0, 1]
        np.testing.assert_array_equal(obs, local_obs)
        for venv in (local, remote):
            venv.step([1, 1])
        _, _, _, _, infos = remote.step([1, 0])
        assert [i["tag"].index for i in infos] == [2, 0]
        assert [i["env"].index for i in infos] == [2, 0]
        # Attributes and return values that are objects.
        assert [t.index for t in remote.call_env_method("tag")] == [2, 0]
        infos[0]["env"].size = 100  # a copy: the env stays on its worker
        assert remote.get_env_attr("size") == [3, 4]
        generators = remote.get_env_attr("np_random")
        assert all(isinstance(g, np.random.Generator) for g in generators)


def test_dict_observations_come_back_as_the_envs_give_them(fleet: Fleet) -> None:
    local, remote = _both([partial(Walker, s, nested=True) for s in (2, 3)], fleet)
    with local, remote:
        assert remote.observation_space == local.observation_space
        assert isinstance(remote.observation_space[0], gym.spaces.Dict)
        results = [venv.reset(seed=[7, 8])[0] for venv in (local, remote)]
        for actions in ([1, 1], [0, 1], [1, 1]):
            results += [venv.step(actions)[0] for venv in (local, remote)]
        for mine, theirs in zip(results[::2], results[1::2], strict=True):
            assert theirs.dtype == object  # an object array of each env's dict, as tianshou's
            _assert_same(theirs, mine)
            assert isinstance(theirs[0]["more"]["pair"], tuple)


class TextObservations(Walker):
    """Observes a string: a space (Text) no EnvSpec carries."""

    def __init__(self) -> None:
        super().__init__(3)
        self.observation_space = gym.spaces.Text(8)


def test_a_space_without_a_wire_form_is_refused_when_the_lease_opens(fleet: Fleet) -> None:
    with pytest.raises(ConfigError, match=r"observation_space cannot travel.*Text"):
        RemoteVectorEnv([TextObservations], on=fleet)


def test_envs_with_different_spaces_share_one_lease(fleet: Fleet) -> None:
    env_fns = [
        lambda: Walker(3),
        lambda: gym.make("CartPole-v1"),
        lambda: Walker(5, nested=True),
        lambda: Walker(9),
    ]
    local, remote = _both(env_fns, fleet)
    with local, remote:
        assert remote.observation_space == local.observation_space
        assert remote.action_space == [gym.spaces.Discrete(2)] * 4
        assert [s.observation_space for s in remote.env_specs] == local.observation_space
        assert remote.env_specs[1].max_episode_length == 500
        results = [venv.reset(seed=3)[0] for venv in (local, remote)]
        for _ in range(3):
            results += [venv.step([1, 1, 1, 1])[0] for venv in (local, remote)]
        for mine, theirs in zip(results[::2], results[1::2], strict=True):
            _assert_same(theirs, mine)


class Reach(Walker):
    """A Walker whose actions are a Box of ``dims`` dimensions."""

    def __init__(self, dims: int) -> None:
        super().__init__(3)
        self.action_space = gym.spaces.Box(-1, 1, (dims,), np.float32)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        return super().step(1)


def test_what_travels_to_the_envs_stays_tensors_and_json(fleet: Fleet) -> None:
    """Where RemoteVectorEnv still differs from RayVectorEnv on any lease:
    actions travel as one tensor per call (one shape for the envs of a
    call), and set_env_attr values and call_env_method arguments as JSON."""
    with RemoteVectorEnv([partial(Reach, 1), partial(Reach, 2)], on=fleet) as remote:
        remote.reset()
        with pytest.raises(UsageError, match="one action of the same shape per env"):
            remote.step([np.zeros(1, np.float32), np.zeros(2, np.float32)])
        remote.reset()
        remote.step([np.zeros(1, np.float32)], id=[0])  # alone, each fits
        with pytest.raises(UsageError, match=r"take plain \(JSON\) values"):
            remote.set_env_attr("tag", Tag(1))


def test_a_lease_of_an_env_id_refuses_objects_naming_the_opt_in(fleet: Fleet) -> None:
    """An env id's lease carries arrays and JSON only (nothing is pickled);
    what it cannot carry is refused, saying how to opt in."""
    opt_in = r"RemoteVectorEnv\(env_fns\).*--allow-pickle"
    objects = EnvConfig("rlfleet/ObjectInfo-v0", imports=TESTING)
    with RemoteVectorEnv(fleet, objects, 2) as venv:
        with pytest.raises(ConfigError, match=rf"neither numeric nor JSON.*{opt_in}"):
            venv.reset()
        with pytest.raises(ConfigError, match=rf"not a plain value.*{opt_in}"):
            venv.get_env_attr("np_random")
    nested = EnvConfig("rlfleet/DictObservation-v0", imports=TESTING)
    with pytest.raises(ConfigError, match=rf"observation_space is a Dict.*{opt_in}"):
        RemoteVectorEnv(fleet, nested, 1)


def test_the_learner_unpickles_only_on_a_lease_of_pickled_factories() -> None:
    """A worker's reply carrying pickles on a lease of an env id is a protocol
    error, and nothing is unpickled; on a lease of pickled factories the same
    reply decodes."""
    answer = LeaseAnswer(0, np.zeros(1, np.float32), 1.0, info={"tag": Tag(4)})
    message = lease_report_message(LeaseAnswers(1, 2, "step", [answer], pickler=dumps), "w")
    data = lease_response([relay_reply(message.lease_reply.SerializeToString()).named("w")])
    box = gym.spaces.Box(0, 1, (1,), np.float32)
    with pytest.raises(ProtocolError, match="not from pickled factories"):
        decode_lease_response(data, ReplyCheck([box]))
    event = decode_lease_response(data, ReplyCheck([box], unpickle=cloudpickle.loads))
    assert event is not None and event.answers[0][-1]["tag"].index == 4  # type: ignore[union-attr]
