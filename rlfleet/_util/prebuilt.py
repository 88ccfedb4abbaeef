"""Frozen dataclass instances made without their ``__init__``, for values checked already.

A frozen dataclass's ``__init__`` sets each field through
``object.__setattr__`` (and a ``__post_init__`` may check them again):
about 0.3 us a field. A learner reads a hundred results a request, each of
them several such objects whose fields its reader has checked already
(rlfleet.wire.result_message, rlfleet.wire.result_views); :func:`prebuilt`
makes them at about half the cost.
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")

_new = object.__new__


def prebuilt(cls: type[T], **fields: Any) -> T:
    """An instance of the (non-slotted) dataclass ``cls`` holding ``fields``, not checked.

    The caller gives every field, with values the constructor would keep as
    they are (no conversion, no check left to ``__post_init__``).
    """
    made = _new(cls)
    made.__dict__.update(fields)  # as prebuilt_of does, without a call more
    return made


def prebuilt_of(cls: type[T], fields: dict[str, Any]) -> T:
    """:func:`prebuilt` of a dict of the fields (not kept: copied into the instance)."""
    made = _new(cls)
    # Frozen: the instance's dict is written directly, as dataclasses' own
    # __init__ does through object.__setattr__, one call for all fields.
    made.__dict__.update(fields)
    return made


__all__ = ["prebuilt", "prebuilt_of"]
