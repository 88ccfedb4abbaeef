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
