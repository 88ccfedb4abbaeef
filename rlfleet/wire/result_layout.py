"""A worker's episode results checked in one pass, with the layout its first result had.

A worker's results repeat one layout: the same fields, info keys, dtypes
and trailing shapes, only the numbers of episodes and steps change. The
general path (:func:`~rlfleet.wire.results.decode_result` then
:func:`~rlfleet.wire.result_checks.check_result`) walks every field's
bytes, builds an EpisodeBatch with its shape checks and checks it: about
450 Python and numpy calls per result, 0.1-0.25 ms on the coordinator's
path. :class:`ResultLayoutCheck` learns the layout of a worker session's
first result that passed that path, and checks each later one in one pass:

* the bytes around the arrays (tags, dtypes, shapes, lengths) must be
  exactly those rlfleet's writer (and protobuf's) gives that layout for the
  header's numbers of episodes and steps, worked out once per pair of
  numbers; then every array is a view at a known offset;
* the values are checked as the general path checks them (metadata,
  episode infos, units' seeds, step types, values against the spaces,
  rewards, bool infos), each with the comparisons the layout leaves: a
  uint8 frame of a 0..255 Box needs none, bounds are worked out once;
* for episodes, what the header's numbers and the task's units tell (the
  lengths column and the int64 episode infos: indices, worker, agent
  version, seeds), the bytes around the arrays, the indices' order and the
  uint8 step types' rules are checked in one call into a C extension
  (rlfleet/wire/_result_check.c), where the result's bytes are;
* the values, in a second call into it (``values_pass``), read where they
  lie (the writer leaves them at unaligned offsets, which numpy's ufuncs
  copy before comparing): ints and floats against their bounds in the
  dtype numpy compares them in, rewards' finite sum, bools 0 or 1. numpy
  screens what it does not take (whole numbers in a float layout, a dtype
  that breaks the space, float16 rewards).

The layout and the bytes it fixes for each pair of numbers are worked out
in :mod:`rlfleet.wire._layout_frames`; this module reads a result against
them.

A result of several chunks is checked where its chunks are: only the
bytes around the arrays and the arrays checked are read, so a result's
uint8 frames are never copied to be checked (the general path joins them).

Any difference from the layout, and any check that does not pass, sends the
result down the general path, which raises with its own text (or finds
nothing wrong: the quick checks may ask it to look closer, never let
through what it refuses) and then relearns the layout. So every check still
runs once, at this trust boundary, and a refusal reads as it always did.
Every episodes result of a worker whose lengths or episode infos are not
int64, or whose step types are not uint8, takes the general path
(rlfleet's workers and the Node worker write those).

A fragment window takes the same pass with its own layout (two more
episode_infos columns, ``stream`` and ``fragment_index``): the metadata and
values as above, then the window's rules on views of its columns
(:func:`~rlfleet.wire.result_checks.window_problems`, the general path's
own: the streams of the task, each stream's ``fragment_length`` steps, its
pieces' continuity and seeds, the step types of pieces that may be cut).
It is answered with the window's batch, of views in the received bytes,
for the coordinator's books of the streams.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from rlfleet._util.compiled import compiled
from rlfleet._util.flags import any_set
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.seeding import NO_ENV_SEED, NO_POLICY_SEED
from rlfleet.wire._layout_frames import (
    _FIELD_NAMES,
    _Frame,
    _Layout,
    _learn,
    _Source,
    _Tensor,
    _Tree,
)
from rlfleet.wire.chunks import Payload, Pieces
from rlfleet.wire.result_checks import (
    FragmentWindow,
    ResultExpectation,
    WindowPieces,
    check_result,
    window_problems,
)
from rlfleet.wire.results import JoinedResult, ResultHeader, decode_result

with compiled("one-pass result check", "rlfleet/wire/_result_check.c"):
    from rlfleet.wire import _result_check
with compiled("result reader", "rlfleet/wire/_result_reader.c"):
    from rlfleet.wire._result_reader import column_summary


class ResultLayoutCheck:
    """One worker session's episode results, checked in one pass once its layout is known.

    Keeps the layout of the session's last episodes result that passed the
    general path, and that of its last fragment window, for the env spec
    each was checked against (an env update brings another spec, and the
    next result relearns). Safe to share between a worker's Join stream and
    its lease data connection: a layout is replaced whole.
    """

    def __init__(self) -> None:
        self._layout: _Layout | None = None
        self._window_layout: _Layout | None = None

    @property
    def learned(self) -> bool:
        """Whether an episodes layout is known (the next result of it takes the one pass)."""
        return self._layout is not None

    @property
    def window_learned(self) -> bool:
        """Whether a fragment window's layout is known (its next window takes the one pass)."""
        return self._window_layout is not None

    def check(
        self, joined: JoinedResult, env_spec: EnvSpec, expect: ResultExpectation
    ) -> EpisodeBatch | None:
        """Checks a whole result: in one pass if it has the layout learned for
        its mode (episodes, or a fragment window), else by the general path
        (which then learns it).

        Returns:
            A fragment window's batch (``expect.window`` set), for the books
            of its streams: views in the received bytes after the one pass,
            the decoded batch after the general path. None for episodes.

        Raises:
            ResultError: As :func:`~rlfleet.wire.result_checks.check_result`
                and :func:`~rlfleet.wire.results.decode_result` raise, with
                their text.
        """
        window = expect.window is not None
        layout = self._window_layout if window else self._layout
        if layout is not None and layout.spec is env_spec:
            payload = joined.payload
            if window:
                source = _reader(payload)
                if _passes(layout, joined.header, payload, source, expect):
                    return _batch_of_views(layout, joined.header, source)
            # Episodes read their bytes in compiled calls: no reader made for them
            # unless a numpy screen is left (_numpy_screens).
            elif _passes(layout, joined.header, payload, None, expect):
                return None
        decoded = decode_result(joined, env_spec)
        check_result(decoded, expect)
        if window:
            self._window_layout = _learn(decoded.batch, window=True)
            return decoded.batch
        self._layout = _learn(decoded.batch, window=False)
        return None


def _reader(payload: Payload | Pieces) -> _Source:
    """A result's bytes, joined or left in its chunks, to read by offset.

    A read inside one chunk is a view of it; one across chunks joins the
    slices (only the bytes around the arrays and the arrays checked are
    read: a result's uint8 frames are never copied to be checked).
    """
    if not isinstance(payload, tuple):
        whole = memoryview(payload)  # slices are views, not copies
        return len(whole), lambda offset, size: whole[offset : offset + size], whole
    pieces = payload
    starts = list(itertools.accumulate((len(piece) for piece in pieces), initial=0))

    def read(offset: int, size: int) -> bytes | memoryview:
        index = bisect.bisect_right(starts, offset) - 1
        local = offset - starts[index]
        if local + size <= len(pieces[index]):
            return pieces[index][local : local + size]
        parts, end = [], offset + size
        while offset < end and index < len(pieces):
            local = offset - starts[index]
            part = pieces[index][local : local + end - offset]
            parts.append(part)
            offset += len(part)
            index += 1
        return b"".join(parts)

    return starts[-1], read, None


def _passes(
    layout: _Layout,
    header: ResultHeader,
    payload: Payload | Pieces,
    source: _Source | None,
    expect: ResultExpectation,
) -> bool:
    """Whether a result (``payload``, read through ``source``: made here if
    None and needed) has the layout and passes every check (False: look closer)."""
    lengths = header.lengths
    # Their sum, min and max in one call: None past int64, where the general path names them.
    summary = column_summary(lengths)
    episodes = len(lengths)
    if summary is None or len(header.episode_indices) != episodes:
        return False
    steps, shortest, longest = summary
    if shortest < 1:
        return False
    if source is not None:
        size = source[0]
    else:  # as _reader counts them
        size = sum(map(len, payload)) if isinstance(payload, tuple) else len(payload)
    skeleton = layout.fitting(episodes, steps, size)
    if skeleton is None:
        return False

    # The metadata and the episode infos (_metadata_problems, _episode_problems).
    version = header.agent_version
    if header.env_generation != expect.env_generation:
        return False
    if expect.agent_version >= 0 and version != expect.agent_version:
        return False
    latest = expect.latest_agent_version
    if latest is not None and not 0 <= version <= latest:
        return False
    limit = expect.env_spec.max_episode_length
    if limit is not None and longest > limit:
        return False
    window = expect.window
    view: _View | None = None
    if window is not None:  # a fragment window: its own rules up to the values
        if source is None:
            source = _reader(payload)
        read = source[1]
        view = _viewer(layout, skeleton, episodes, steps, source)
        for offset, expected in skeleton.headers:
            if read(offset, len(expected)) != expected:
                return False
        batch_lengths = view("lengths")
        if batch_lengths.tolist() != list(lengths):
            return False
        if view("episode_infos['episode_index']").tolist() != list(header.episode_indices):
            return False
        if not _window_passes(
            layout, view, window, worker_id=expect.worker_id, version=version, lengths=batch_lengths
        ):
            return False
    else:
        # One compiled call: the bytes around the arrays, the int64 columns
        # the header's numbers and the task's units tell (lengths, episode
        # infos), the indices' order and the step types' rules (which also
        # keep every value in StepType's range). A number past int64 fails
        # it: the general path names it.
        units = expect.units
        seeds: tuple[int, int] | _result_check.UnitBuffers | None
        if expect.native:
            seeds = (NO_ENV_SEED, NO_POLICY_SEED)
        elif units is not None:
            seeds = (units.episode_indices, units.env_seeds, units.policy_seeds)
        else:  # nothing to hold them to
            seeds = None
        if not _result_check.episodes_pass(
            payload,
            skeleton.between,
            skeleton.places,
            lengths,
            header.episode_indices,
            expect.worker_id,
            version,
            seeds,
        ):
            return False
    # Values against the declared spaces, rewards, bool infos (value_problems,
    # the decode): one compiled call reads them where they lie (the
    # skeleton's offsets); numpy screens the rest, through ``view`` (made
    # only when a numpy screen is left, as is the reader ``source``). The
    # layouts rlfleet's workers write leave nothing to numpy.
    if not _result_check.values_pass(
        payload, layout.compiled_screens, skeleton.offsets, episodes, steps
    ):
        return False
    return not (layout.screens or layout.finite_rewards) or _numpy_screens(
        layout, payload, source, frame=skeleton, episodes=episodes, steps=steps, view=view
    )


#: An array of a result checked in one pass, by name (views, not copies, where they can be).
_View = Callable[[str], np.ndarray]


def _viewer(layout: _Layout, frame: _Frame, episodes: int, steps: int, payload: _Source) -> _View:
    """The arrays of a result of ``layout`` whose bytes match ``frame``."""
    _, read, whole = payload
    tensors, offsets = layout.tensors, frame.offsets

    def view(name: str) -> np.ndarray:
        t = tensors[name]
        rows = episodes if t.per_episode else steps
        if whole is not None:
            return np.ndarray((rows, *t.row_shape), t.dtype, buffer=whole, offset=offsets[name])
        data = read(offsets[name], rows * t.row_bytes)
        return np.frombuffer(data, t.dtype).reshape(rows, *t.row_shape)

    return view


def _numpy_screens(
    layout: _Layout,
    payload: Payload | Pieces,
    source: _Source | None,
    *,
    frame: _Frame,
    episodes: int,
    steps: int,
    view: _View | None = None,
) -> bool:
    """The value screens left to numpy (``layout.screens``, float rewards' sum)."""
    if view is None:
        view = _viewer(
            layout, frame, episodes, steps, _reader(payload) if source is None else source
        )
    for name, screen in layout.screens:
        if not screen(view(name)):
            return False
    return not layout.finite_rewards or math.isfinite(
        np.add.reduce(view("rewards"), dtype=np.float64)
    )


def _window_passes(
    layout: _Layout,
    view: _View,
    window: FragmentWindow,
    *,
    worker_id: int,
    version: int,
    lengths: np.ndarray,
) -> bool:
    """A fragment window's own rules, after the metadata both modes share and
    before the values (``version``: the result's agent version; ``lengths``: its pieces')."""
    for name, want in (("worker", worker_id), ("agent_version", version)):
        if any_set(view(f"episode_infos[{name!r}]") != want):
            return False
    pieces = WindowPieces.of(
        lambda key: view(f"episode_infos[{key!r}]"), lengths, view("step_types")
    )
    return not window_problems(pieces, window)


def _batch_of_views(layout: _Layout, header: ResultHeader, payload: _Source) -> EpisodeBatch:
    """A fragment window that passed in one pass, as a batch of views of its bytes."""
    lengths = header.lengths
    episodes, steps = len(lengths), sum(lengths)
    view = _viewer(layout, layout.skeleton(episodes, steps), episodes, steps, payload)
    keys = layout.keys

    def arrays(item: _Tensor | _Tree) -> Any:
        if isinstance(item, _Tensor):
            return view(item.name)
        return {keys[key_field]: arrays(child) for key_field, child in item}

    # An empty map is not written: its field is absent from the blocks.
    fields: dict[str, Any] = {"episode_infos": {}, "env_infos": {}, "agent_infos": {}}
    for number, item in layout.blocks:
        fields[_FIELD_NAMES[number]] = arrays(item)
    return EpisodeBatch.prechecked(env_spec=layout.spec, check_actions=False, **fields)


__all__ = ["ResultLayoutCheck"]
