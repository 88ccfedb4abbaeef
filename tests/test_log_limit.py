"""Unit tests for rlfleet._util.log_limit: lines limited per interval or per key."""

from __future__ import annotations

import threading

from rlfleet._util.log_limit import LogLimiter, OncePerKey, held_back_note


def test_once_per_key_says_yes_once_per_key_even_across_threads() -> None:
    once = OncePerKey()
    answers: list[bool] = []
    lock = threading.Lock()

    def ask() -> None:
        for _ in range(100):
            first = once.first("10.0.0.1:50053")
            with lock:
                answers.append(first)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers.count(True) == 1
    assert once.first("10.0.0.2:50053") is True
    assert once.first("10.0.0.2:50053") is False


def test_log_limiter_lets_one_line_through_per_interval_and_counts_the_rest() -> None:
    now = [0.0]
    limiter = LogLimiter(10.0, clock=lambda: now[0])
    assert limiter.admit() == 0
    assert limiter.admit() is None
    assert limiter.admit() is None
    now[0] = 10.0
    assert limiter.admit() == 2
    assert held_back_note(2, "refusals") == " (2 more refusals since the last report)"
    assert held_back_note(0, "refusals") == ""
