"""benchmarks/learner_path.py: captured answers replay to the batches their sampler returned.

Its instruction counts are the learner's path over captured answers, so a
replay must read and place them exactly as the sampler did.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from benchmarks import learner_path
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


def test_a_replay_of_one_request_size_takes_only_those_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two request sizes replayed apart tell a cost per request from one per result.
    answers: list[dict[str, Any]] = []
    with capturing(answers), Fleet.local(workers=2, envs_per_worker=2, seed=5) as sampler:
        for episodes in (8, 8, 12):
            sampler.obtain_episodes(episodes)
    path = tmp_path / "answers.pickle"
    path.write_bytes(pickle.dumps(answers))
    for amount, count in ((8, 2), (12, 1)):
        learner_path.main(["replay", str(path), "--repeats", "1", "--amount", str(amount)])
        assert capsys.readouterr().out.startswith(f"{count} answers, ")
    learner_path.main(["replay", str(path), "--repeats", "1"])
    assert capsys.readouterr().out.startswith("3 answers, ")
    with pytest.raises(SystemExit):
        learner_path.main(["replay", str(path), "--amount", "9"])
