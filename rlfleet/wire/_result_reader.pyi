"""Type stub of the compiled result reader (rlfleet/wire/_result_reader.c)."""

from typing import TypeAlias

from typing_extensions import Buffer

#: What ``read_message`` returns: task_id, worker_id, episode_indices,
#: lengths, agent_version, env_generation, wire (the result's fields before
#: its chunk on chunk 0, else empty), the chunk's batch_id, index, count,
#: total_bytes and kind, and its data's start and end offsets in the buffer.
MessageRead: TypeAlias = tuple[
    int, int, tuple[int, ...], tuple[int, ...], int, int, bytes, int, int, int, int, int, int, int
]
#: What ``read_frame`` returns: a ``MessageRead`` (wire empty), then the result_call.
FrameRead: TypeAlias = tuple[
    int,
    int,
    tuple[int, ...],
    tuple[int, ...],
    int,
    int,
    bytes,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
]

def read_message(data: Buffer, /) -> MessageRead | None: ...
def read_frame(data: Buffer, /) -> FrameRead | None: ...
