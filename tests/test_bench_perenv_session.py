"""benchmarks/perenv_session.py: a session's stepping-thread work, the same in every run.

Its instruction counts are read as the difference of two runs of different
lengths, so a run must do the same work whatever the machine's load: its
flush timer runs on a simulated clock.
"""

from __future__ import annotations

from benchmarks.perenv_session import SessionLoop


def test_the_session_loop_sends_what_it_steps_and_repeats_itself() -> None:
    runs = []
    for _ in range(2):
        loop = SessionLoop("CartPole-v1", 8, 11e-6)
        sent = loop.run(3000)
        assert sent >= 3000 and loop.results >= 1
        # Every step taken was sent once, or is in an episode not sent yet.
        vec = loop.vec
        assert loop.sent_steps + vec.finished_steps + vec.active_steps == loop.stepped
        runs.append((sent, loop.results, loop.stepped))
    assert runs[0] == runs[1]


def test_the_native_session_loop_refills_one_task_and_repeats_itself() -> None:
    runs = []
    for _ in range(2):
        loop = SessionLoop("CartPole-v1", 64, 1.4e-6, native=True)
        sent = loop.run(20_000)
        # 8,192-step flushes, every one a result of the request's one task.
        assert sent >= 20_000 and loop.results == sent // loop.policy.step_limit
        assert list(loop.book.episode_tasks) == [1]
        vec = loop.vec
        assert loop.sent_steps + vec.finished_steps + vec.active_steps == loop.stepped
        runs.append((sent, loop.results, loop.stepped))
    assert runs[0] == runs[1]
