"""The learner's CPU per result on its results connection, replayed from captured answers.

Capture (runs ``benchmarks.capacity --carrier data --shapes cartpole`` in
this process, recording what each Sample call's learner read: the call's
responses and the frames of its results connection)::

    python -m benchmarks.learner_path capture answers.pickle --scale 0.25

Replay (the learner's path in one process, no sockets: each answer's
responses and frames go through ``collect_answer`` and
``AnswerMemory.episodes`` as a ``RemoteSampler`` reads them; the frames are
fresh buffers per replay, as the connection's reads give)::

    python -m benchmarks.learner_path replay answers.pickle --episodes 4 --repeats 20

Counted with ``valgrind --tool=callgrind`` at two ``--repeats`` (say 10 and
30), the difference over the extra results' count is the instructions per
result with start-up and warm-up taken out (the first replay of each answer
learns the workers' layouts: it is run before the counted ones either way).
``replay`` prints the results per replay so that the division needs no guess.
"""

from __future__ import annotations

import argparse
import contextlib
import pickle
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

from rlfleet.client import _coordinator_calls
from rlfleet.client._responses import AnswerMemory, SampleAnswer, collect_answer
from rlfleet.client._result_route import DataResults
from rlfleet.core import EpisodeBatch
from rlfleet.protocol.modes import Mode
from rlfleet.transport.lease_channel import DataLink


class _RecordingLink:
    """A results connection whose frames are also kept (as bytes)."""

    def __init__(self, link: Any, frames: list[bytes]) -> None:
        self._link = link
        self._frames = frames

    def receive_message(self, seconds: float | None, *, gather: int = 0) -> Any:
        payload = self._link.receive_message(seconds, gather=gather)
        if payload is not None:
            self._frames.append(bytes(payload))
        return payload

    def __getattr__(self, name: str) -> Any:
        # The request sent on the connection, its readability: the link's own.
        return getattr(self._link, name)


class _ReplayedLink:
    """A results connection that gives captured frames, each in a fresh buffer."""

    def __init__(self, frames: Sequence[bytearray]) -> None:
        self._frames = iter(frames)

    def receive_message(self, seconds: float | None, *, gather: int = 0) -> memoryview | None:
        return memoryview(next(self._frames))

    def close(self) -> None:
        """Nothing to close."""


@contextlib.contextmanager
def capturing(answers: list[dict[str, Any]]) -> Iterator[None]:
    """Records every Sample answer a sampler of this process collects into ``answers``:
    its responses, its results connection's frames, what it asked for, how many
    episodes the learner takes of it and its results' count."""
    original = _coordinator_calls.collect_answer

    def recording(call: Iterable[Any], *args: Any, data: DataResults | None = None) -> SampleAnswer:
        _, mode, amount, _ = args  # collect_answer's reader, mode, amount, progress
        parts: list[Any] = []
        frames: list[bytes] = []

        def responses() -> Iterator[Any]:
            for part in call:
                parts.append(part)
                # A header read on the connection (the request went there) is
                # replayed from the parts, not as a result frame.
                frames.clear()
                yield part

        if data is not None:
            # Reads frames as the connection does; sends what the sampler sends.
            data._link = cast(DataLink, _RecordingLink(data._link, frames))
        answer = original(responses(), *args, data=data)
        answers.append(
            {
                "parts": parts,
                "frames": frames,
                "mode": mode,
                "amount": amount,
                "call": None if data is None else data._call,
                # What the sampler takes of it (obtain_episodes: the request's).
                "episodes": amount if mode == Mode.EPISODES else answer.footer.num_episodes,
                "results": len(answer.results),
            }
        )
        return answer

    _coordinator_calls.collect_answer = recording  # type: ignore[assignment]
    try:
        yield
    finally:
        _coordinator_calls.collect_answer = original


def capture(path: Path, scale: float) -> None:
    """Runs the capacity benchmark's CartPole shape on the data carrier and keeps its answers."""
    from benchmarks import capacity

    answers: list[dict[str, Any]] = []
    with capturing(answers):
        capacity.main(["--carrier", "data", "--shapes", "cartpole", "--scale", str(scale)])
    path.write_bytes(pickle.dumps(answers))
    print(f"{len(answers)} answers kept in {path}")


def replay(path: Path, episodes: int, repeats: int, amount: int | None = None) -> None:
    """Replays the captured answers whose results hold ``episodes`` episodes, ``repeats`` times
    (``amount``: only those of requests that asked for that many steps or episodes)."""
    answers = [
        answer
        for answer in pickle.loads(path.read_bytes())
        if answer["call"] is not None
        and _episodes_per_result(answer) == episodes
        and amount in (None, answer["amount"])
    ]
    if not answers:
        raise SystemExit(f"no captured answer of {episodes}-episode results on the data carrier")
    memory = AnswerMemory()
    per_replay = sum(results for results, _ in replayed(answers, memory))  # learns the layouts
    start = time.thread_time_ns()
    for _ in range(repeats):
        replayed(answers, memory)
    spent = time.thread_time_ns() - start
    print(
        f"{len(answers)} answers, {per_replay} results per replay, {repeats} replays: "
        f"{spent / 1000 / (repeats * per_replay):.1f} us of thread CPU per result"
    )


def replayed(
    answers: Sequence[dict[str, Any]], memory: AnswerMemory
) -> list[tuple[int, EpisodeBatch]]:
    """Each captured answer (on the data carrier) read and placed as its sampler did:
    its results' count and its batch (``memory`` kept across answers, as a sampler's)."""
    out = []
    for answer in answers:
        frames = [bytearray(frame) for frame in answer["frames"]]
        link = cast(DataLink, _ReplayedLink(frames))
        data = DataResults(link, answer["call"], None, "replay")
        reader = memory.reader("replay", keep_pieces=True)
        got = collect_answer(
            iter(answer["parts"]), reader, answer["mode"], answer["amount"], None, data=data
        )
        out.append((len(got.results), memory.episodes(got, answer["episodes"])))
    return out


def _episodes_per_result(answer: dict[str, Any]) -> int:
    """The capacity benchmark's setting the answer was made with (4 or 80 episodes a result)."""
    ratio = answer["episodes"] / max(answer["results"], 1)
    return 4 if ratio < 20 else 80


def main(argv: Sequence[str] | None = None) -> int:
    """Captures or replays (see the module's docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.learner_path", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    kept = commands.add_parser("capture", help="run the capacity benchmark and keep its answers")
    kept.add_argument("path", type=Path)
    kept.add_argument("--scale", type=float, default=0.25)
    replayed = commands.add_parser("replay", help="replay kept answers through the learner's path")
    replayed.add_argument("path", type=Path)
    replayed.add_argument(
        "--episodes", type=int, default=4, choices=(4, 80), help="episodes per result to replay"
    )
    replayed.add_argument("--repeats", type=int, default=10)
    replayed.add_argument(
        "--amount",
        type=int,
        help="replay only the answers to requests of this size (a cost per request "
        "and one per result are told apart by two sizes)",
    )
    args = parser.parse_args(argv)
    if args.command == "capture":
        capture(args.path, args.scale)
    else:
        replay(args.path, args.episodes, args.repeats, args.amount)
    return 0


if __name__ == "__main__":
    sys.exit(main())
