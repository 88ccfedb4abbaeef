from rlfleet.v1 import batch_pb2 as _batch_pb2
from rlfleet.v1 import leases_pb2 as _leases_pb2
from rlfleet.v1 import spaces_pb2 as _spaces_pb2
from rlfleet.v1 import tensor_pb2 as _tensor_pb2
from rlfleet.v1 import updates_pb2 as _updates_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProtocolVersion(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROTOCOL_VERSION_UNSPECIFIED: _ClassVar[ProtocolVersion]
    PROTOCOL_VERSION_1: _ClassVar[ProtocolVersion]

class SampleMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SAMPLE_MODE_UNSPECIFIED: _ClassVar[SampleMode]
    SAMPLE_MODE_STEPS: _ClassVar[SampleMode]
    SAMPLE_MODE_EPISODES: _ClassVar[SampleMode]
    SAMPLE_MODE_FRAGMENTS: _ClassVar[SampleMode]
PROTOCOL_VERSION_UNSPECIFIED: ProtocolVersion
PROTOCOL_VERSION_1: ProtocolVersion
SAMPLE_MODE_UNSPECIFIED: SampleMode
SAMPLE_MODE_STEPS: SampleMode
SAMPLE_MODE_EPISODES: SampleMode
SAMPLE_MODE_FRAGMENTS: SampleMode

class WorkerMessage(_message.Message):
    __slots__ = ("hello", "env_ready", "agent_ready", "result", "heartbeat", "error", "leaving", "lease_reply", "results_switch")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    ENV_READY_FIELD_NUMBER: _ClassVar[int]
    AGENT_READY_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    LEASE_REPLY_FIELD_NUMBER: _ClassVar[int]
    RESULTS_SWITCH_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    env_ready: EnvReady
    agent_ready: AgentReady
    result: EpisodeResult
    heartbeat: Heartbeat
    error: WorkerError
    leaving: Leaving
    lease_reply: _leases_pb2.LeaseReply
    results_switch: _leases_pb2.LeaseDataSwitch
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., env_ready: _Optional[_Union[EnvReady, _Mapping]] = ..., agent_ready: _Optional[_Union[AgentReady, _Mapping]] = ..., result: _Optional[_Union[EpisodeResult, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., error: _Optional[_Union[WorkerError, _Mapping]] = ..., leaving: _Optional[_Union[Leaving, _Mapping]] = ..., lease_reply: _Optional[_Union[_leases_pb2.LeaseReply, _Mapping]] = ..., results_switch: _Optional[_Union[_leases_pb2.LeaseDataSwitch, _Mapping]] = ...) -> None: ...

class CoordinatorMessage(_message.Message):
    __slots__ = ("welcome", "env_update", "agent_update", "task", "cancel", "drain", "lease")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    ENV_UPDATE_FIELD_NUMBER: _ClassVar[int]
    AGENT_UPDATE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    env_update: _updates_pb2.EnvUpdate
    agent_update: _updates_pb2.AgentUpdate
    task: Task
    cancel: Cancel
    drain: Drain
    lease: _leases_pb2.LeaseCommand
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., env_update: _Optional[_Union[_updates_pb2.EnvUpdate, _Mapping]] = ..., agent_update: _Optional[_Union[_updates_pb2.AgentUpdate, _Mapping]] = ..., task: _Optional[_Union[Task, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., drain: _Optional[_Union[Drain, _Mapping]] = ..., lease: _Optional[_Union[_leases_pb2.LeaseCommand, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("protocol_version", "capabilities", "num_envs", "name", "host", "pid", "implementation", "lease_slots")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    NUM_ENVS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    IMPLEMENTATION_FIELD_NUMBER: _ClassVar[int]
    LEASE_SLOTS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    num_envs: int
    name: str
    host: str
    pid: int
    implementation: str
    lease_slots: int
    def __init__(self, protocol_version: _Optional[int] = ..., capabilities: _Optional[_Iterable[str]] = ..., num_envs: _Optional[int] = ..., name: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., implementation: _Optional[str] = ..., lease_slots: _Optional[int] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("protocol_version", "worker_id", "name", "heartbeat_interval_seconds", "heartbeat_timeout_seconds", "max_message_bytes", "capabilities", "first_stream", "coordinator_id", "lease_data")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    FIRST_STREAM_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_DATA_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    worker_id: int
    name: str
    heartbeat_interval_seconds: float
    heartbeat_timeout_seconds: float
    max_message_bytes: int
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    first_stream: int
    coordinator_id: str
    lease_data: _leases_pb2.LeaseDataAddress
    def __init__(self, protocol_version: _Optional[int] = ..., worker_id: _Optional[int] = ..., name: _Optional[str] = ..., heartbeat_interval_seconds: _Optional[float] = ..., heartbeat_timeout_seconds: _Optional[float] = ..., max_message_bytes: _Optional[int] = ..., capabilities: _Optional[_Iterable[str]] = ..., first_stream: _Optional[int] = ..., coordinator_id: _Optional[str] = ..., lease_data: _Optional[_Union[_leases_pb2.LeaseDataAddress, _Mapping]] = ...) -> None: ...

class EnvReady(_message.Message):
    __slots__ = ("generation", "env_spec")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ENV_SPEC_FIELD_NUMBER: _ClassVar[int]
    generation: int
    env_spec: _spaces_pb2.EnvSpec
    def __init__(self, generation: _Optional[int] = ..., env_spec: _Optional[_Union[_spaces_pb2.EnvSpec, _Mapping]] = ...) -> None: ...

class AgentReady(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class EpisodeUnit(_message.Message):
    __slots__ = ("episode_index", "env_seed", "policy_seed")
    EPISODE_INDEX_FIELD_NUMBER: _ClassVar[int]
    ENV_SEED_FIELD_NUMBER: _ClassVar[int]
    POLICY_SEED_FIELD_NUMBER: _ClassVar[int]
    episode_index: int
    env_seed: int
    policy_seed: int
    def __init__(self, episode_index: _Optional[int] = ..., env_seed: _Optional[int] = ..., policy_seed: _Optional[int] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("task_id", "request_id", "mode", "agent_version", "env_generation", "units", "fragment_length", "rounds", "base_seed", "streams", "replays", "unit_columns")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENV_GENERATION_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    BASE_SEED_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    REPLAYS_FIELD_NUMBER: _ClassVar[int]
    UNIT_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    request_id: int
    mode: SampleMode
    agent_version: int
    env_generation: int
    units: _containers.RepeatedCompositeFieldContainer[EpisodeUnit]
    fragment_length: int
    rounds: int
    base_seed: int
    streams: _containers.RepeatedScalarFieldContainer[int]
    replays: _containers.RepeatedCompositeFieldContainer[ReliabilityStreamReplay]
    unit_columns: EpisodeUnitColumns
    def __init__(self, task_id: _Optional[int] = ..., request_id: _Optional[int] = ..., mode: _Optional[_Union[SampleMode, str]] = ..., agent_version: _Optional[int] = ..., env_generation: _Optional[int] = ..., units: _Optional[_Iterable[_Union[EpisodeUnit, _Mapping]]] = ..., fragment_length: _Optional[int] = ..., rounds: _Optional[int] = ..., base_seed: _Optional[int] = ..., streams: _Optional[_Iterable[int]] = ..., replays: _Optional[_Iterable[_Union[ReliabilityStreamReplay, _Mapping]]] = ..., unit_columns: _Optional[_Union[EpisodeUnitColumns, _Mapping]] = ...) -> None: ...

class EpisodeUnitColumns(_message.Message):
    __slots__ = ("episode_indices", "env_seeds", "policy_seeds")
    EPISODE_INDICES_FIELD_NUMBER: _ClassVar[int]
    ENV_SEEDS_FIELD_NUMBER: _ClassVar[int]
    POLICY_SEEDS_FIELD_NUMBER: _ClassVar[int]
    episode_indices: bytes
    env_seeds: bytes
    policy_seeds: bytes
    def __init__(self, episode_indices: _Optional[bytes] = ..., env_seeds: _Optional[bytes] = ..., policy_seeds: _Optional[bytes] = ...) -> None: ...

class ReliabilityStreamReplay(_message.Message):
    __slots__ = ("stream", "episode_index", "fragment_index", "actions", "last_observation")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    EPISODE_INDEX_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    LAST_OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    stream: int
    episode_index: int
    fragment_index: int
    actions: _tensor_pb2.Tensor
    last_observation: _tensor_pb2.Tensor
    def __init__(self, stream: _Optional[int] = ..., episode_index: _Optional[int] = ..., fragment_index: _Optional[int] = ..., actions: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., last_observation: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("task_id", "episode_indices")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPISODE_INDICES_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    episode_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, task_id: _Optional[int] = ..., episode_indices: _Optional[_Iterable[int]] = ...) -> None: ...

class Drain(_message.Message):
    __slots__ = ("reason", "grace_seconds")
    REASON_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    reason: str
    grace_seconds: float
    def __init__(self, reason: _Optional[str] = ..., grace_seconds: _Optional[float] = ...) -> None: ...

class EpisodeResult(_message.Message):
    __slots__ = ("task_id", "episode_indices", "lengths", "agent_version", "env_generation", "worker_id", "chunk")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPISODE_INDICES_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENV_GENERATION_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    episode_indices: _containers.RepeatedScalarFieldContainer[int]
    lengths: _containers.RepeatedScalarFieldContainer[int]
    agent_version: int
    env_generation: int
    worker_id: int
    chunk: _batch_pb2.BatchChunk
    def __init__(self, task_id: _Optional[int] = ..., episode_indices: _Optional[_Iterable[int]] = ..., lengths: _Optional[_Iterable[int]] = ..., agent_version: _Optional[int] = ..., env_generation: _Optional[int] = ..., worker_id: _Optional[int] = ..., chunk: _Optional[_Union[_batch_pb2.BatchChunk, _Mapping]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("steps_total", "steps_per_second", "active_envs", "queued_units")
    STEPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    STEPS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_ENVS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_UNITS_FIELD_NUMBER: _ClassVar[int]
    steps_total: int
    steps_per_second: float
    active_envs: int
    queued_units: int
    def __init__(self, steps_total: _Optional[int] = ..., steps_per_second: _Optional[float] = ..., active_envs: _Optional[int] = ..., queued_units: _Optional[int] = ...) -> None: ...

class WorkerError(_message.Message):
    __slots__ = ("detail",)
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    detail: _updates_pb2.ErrorDetail
    def __init__(self, detail: _Optional[_Union[_updates_pb2.ErrorDetail, _Mapping]] = ...) -> None: ...

class Leaving(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...
