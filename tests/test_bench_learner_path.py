"""benchmarks/learner_path.py: captured answers replay to the batches their sampler returned.

Its instruction counts are the learner's path over captured answers, so a
replay must read and place them exactly as the sampler did.
"""

from __future__ import annotations

from typing import Any

from benchmarks.learner_path import capturing, replayed
from rlfleet.client import Fleet
from rlfleet.client._responses import AnswerMemory
from tests._coordinator_fakes import assert_same_batch


def test_captured_answers_replay_to_the_batches_their_sampler_returned() -> None:
    answers: list[dict[str, Any]] = []
    with capturing(answers), Fleet.local(workers=2, envs_per_worker=2, seed=5) as sampler:
        batches = [sampler.obtain_episodes(6), sampler.obtain_samples(0, 200)]
    assert len(answers) == 2 and all(answer["frames"] for answer in answers)
    memory = AnswerMemory()
    for _ in range(2):  # the second time from the layouts the first learned
        got = replayed(answers, memory)
        assert [count for count, _ in got] == [answer["results"] for answer in answers]
        for (_, batch), expected in zip(got, batches, strict=True):
            assert_same_batch(batch, expected)
    assert memory.layouts.viewed > 0
