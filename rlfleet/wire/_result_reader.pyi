"""Type stub of the compiled result reader (rlfleet/wire/_result_reader.c)."""

from types import NotImplementedType
from typing import Any, TypeAlias

from typing_extensions import Buffer

#: What ``read_message`` returns: ``ResultHeader``'s fields by name (``wire``
#: the result's fields before its chunk on chunk 0, else empty), ``Chunk``'s
#: fields but its data by name, and the data's start and end offsets in the
#: buffer (equal for a chunk without data).
MessageRead: TypeAlias = tuple[dict[str, Any], dict[str, Any], int, int]
#: What ``read_frame`` returns: a ``MessageRead`` (``wire`` empty), then the
#: frame's result_call.
FrameRead: TypeAlias = tuple[dict[str, Any], dict[str, Any], int, int, int]

def read_message(data: Buffer, /) -> MessageRead | None: ...
def read_frame(data: Buffer, /) -> FrameRead | None: ...
def read_frame_made(
    data: Buffer,
    header_type: type[Any],
    chunk_type: type[Any],
    context: tuple[Any, ...] | None = None,
    /,
) -> tuple[int, Any, Any] | Any | NotImplementedType | None: ...
def read_message_made(
    data: Buffer, header_type: type[Any], chunk_type: type[Any], /
) -> tuple[Any, Any] | NotImplementedType | None: ...
def column_summary(values: object, /) -> tuple[int, int, int] | None: ...
def read_frame_pieces(head: Buffer, data: Buffer, tail: Buffer, /) -> FrameRead | None: ...
