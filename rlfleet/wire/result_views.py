"""A learner's results decoded as views, with the layout of their worker's last one.

The coordinator checked every value of a result before passing it on
(:class:`~rlfleet.wire.result_layout.ResultLayoutCheck`); the learner only
decodes what it receives. A result of one chunk with the layout its worker's
last result had (the same bytes around the arrays for its numbers of
episodes and steps) is viewed at that layout's offsets: a few slice
comparisons and a view per array, instead of walking every field (about 230
Python and numpy calls) and building the EpisodeBatch with its checks. What
decoding checks on values still holds: the lengths are the header's, the
step types in StepType's range, bools 0 or 1. Anything else (another layout,
a value those checks refuse, a result of several chunks, a space whose rows
are checked by ``contains``) takes :func:`~rlfleet.wire.results.decode_kept`,
which raises with its own text, or decodes and relearns the worker's layout.
"""

from __future__ import annotations

import numpy as np

from rlfleet._util.flags import any_set
from rlfleet.core._validation import accepted_shapes, check_step_types
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.errors import InvalidBatchError
from rlfleet.wire.chunks import Payload
from rlfleet.wire.result_layout import _batch_of_views, _Layout, _learn, _reader, _viewer
from rlfleet.wire.results import DecodedResult, JoinedResult, Result, ResultHeader, decode_kept


class ResultLayoutViews:
    """A learner's decoder of results to views, one learned layout per worker."""

    #: Workers whose layouts are kept (a fleet past it starts again).
    MAX_WORKERS = 4096

    def __init__(self) -> None:
        self._layouts: dict[int, _Layout] = {}
        #: Results decoded in one pass and by the general path (tests count them).
        self.viewed = 0
        self.decoded = 0

    def decode(self, joined: JoinedResult, env_spec: EnvSpec) -> Result:
        """The result's batch as views of its bytes.

        Raises:
            ResultError: As :func:`~rlfleet.wire.results.decode_kept`, with its text.
        """
        header = joined.header
        layout = self._layouts.get(header.worker_id)
        payload = joined.payload
        if layout is not None and layout.spec is env_spec and not isinstance(payload, tuple):
            batch = _viewed(layout, header, payload)
            if batch is not None:
                self.viewed += 1
                return DecodedResult(header, batch, joined.chunks, joined.message_sizes)
        result = decode_kept(joined, env_spec)
        self.decoded += 1
        if isinstance(result, DecodedResult):
            learned = _learn(result.batch, False)
            if learned is not None and _viewable(learned):
                if len(self._layouts) >= self.MAX_WORKERS:
                    self._layouts.clear()
                self._layouts[header.worker_id] = learned
            else:
                self._layouts.pop(header.worker_id, None)
        return result


def _viewable(layout: _Layout) -> bool:
    """Whether decoding checks nothing of the layout's rows but their shape
    (a space without accepted shapes has its first row checked by ``contains``)."""
    spec = layout.spec
    return (
        accepted_shapes(spec.observation_space) is not None
        and accepted_shapes(spec.action_space) is not None
        and layout.tensors["step_types"].dtype.kind in "iu"
    )


def _viewed(layout: _Layout, header: ResultHeader, payload: Payload) -> EpisodeBatch | None:
    """The batch of a one-chunk result with the layout, read-only views of
    ``payload`` (as :func:`~rlfleet.wire.batches.decode_batch` leaves them);
    None for anything the general path must read."""
    lengths = header.lengths
    episodes = len(lengths)
    if not episodes or min(lengths) < 1:
        return None
    steps = sum(lengths)
    whole = memoryview(payload)
    if whole.format != "B" or whole.ndim != 1:
        whole = whole.cast("B")
    source = _reader(whole.toreadonly())
    size, read, _ = source
    frame = layout.fitting_frame(episodes, steps, size)  # not the one pass's skeleton
    if frame is None:
        return None
    for offset, expected in frame.headers:
        if read(offset, len(expected)) != expected:
            return None
    view = _viewer(layout, frame, episodes, steps, source)
    if view("lengths").tolist() != list(lengths):
        return None
    try:
        check_step_types("step_types", view("step_types"), steps, "steps")
    except InvalidBatchError:
        return None
    if any(any_set(view(name).view(np.uint8) > 1) for name in layout.bools):
        return None
    return _batch_of_views(layout, header, source, frame)


__all__ = ["ResultLayoutViews"]
