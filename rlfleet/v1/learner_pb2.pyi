from rlfleet.v1 import leases_pb2 as _leases_pb2
from rlfleet.v1 import spaces_pb2 as _spaces_pb2
from rlfleet.v1 import updates_pb2 as _updates_pb2
from rlfleet.v1 import worker_pb2 as _worker_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResultChannelRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResultChannelOpened(_message.Message):
    __slots__ = ("channel_id", "data", "requests_on_data", "max_request_bytes")
    CHANNEL_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_ON_DATA_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEST_BYTES_FIELD_NUMBER: _ClassVar[int]
    channel_id: int
    data: _leases_pb2.LeaseDataAddress
    requests_on_data: bool
    max_request_bytes: int
    def __init__(self, channel_id: _Optional[int] = ..., data: _Optional[_Union[_leases_pb2.LeaseDataAddress, _Mapping]] = ..., requests_on_data: _Optional[bool] = ..., max_request_bytes: _Optional[int] = ...) -> None: ...

class CallFailure(_message.Message):
    __slots__ = ("code", "message", "detail")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    detail: _updates_pb2.ErrorDetail
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., detail: _Optional[_Union[_updates_pb2.ErrorDetail, _Mapping]] = ...) -> None: ...

class ResultsEnd(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: int
    def __init__(self, results: _Optional[int] = ...) -> None: ...

class SampleRequest(_message.Message):
    __slots__ = ("mode", "amount", "fragment_length", "seed", "request_index", "agent_update", "env_update", "wait_for_workers_seconds", "itr", "coordinator_id", "first_episode", "result_channel", "result_call", "footer_on_data")
    MODE_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_INDEX_FIELD_NUMBER: _ClassVar[int]
    AGENT_UPDATE_FIELD_NUMBER: _ClassVar[int]
    ENV_UPDATE_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOR_WORKERS_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ITR_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_EPISODE_FIELD_NUMBER: _ClassVar[int]
    RESULT_CHANNEL_FIELD_NUMBER: _ClassVar[int]
    RESULT_CALL_FIELD_NUMBER: _ClassVar[int]
    FOOTER_ON_DATA_FIELD_NUMBER: _ClassVar[int]
    mode: _worker_pb2.SampleMode
    amount: int
    fragment_length: int
    seed: int
    request_index: int
    agent_update: _updates_pb2.AgentUpdate
    env_update: _updates_pb2.EnvUpdate
    wait_for_workers_seconds: float
    itr: int
    coordinator_id: str
    first_episode: int
    result_channel: int
    result_call: int
    footer_on_data: bool
    def __init__(self, mode: _Optional[_Union[_worker_pb2.SampleMode, str]] = ..., amount: _Optional[int] = ..., fragment_length: _Optional[int] = ..., seed: _Optional[int] = ..., request_index: _Optional[int] = ..., agent_update: _Optional[_Union[_updates_pb2.AgentUpdate, _Mapping]] = ..., env_update: _Optional[_Union[_updates_pb2.EnvUpdate, _Mapping]] = ..., wait_for_workers_seconds: _Optional[float] = ..., itr: _Optional[int] = ..., coordinator_id: _Optional[str] = ..., first_episode: _Optional[int] = ..., result_channel: _Optional[int] = ..., result_call: _Optional[int] = ..., footer_on_data: _Optional[bool] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("mode", "fragment_length", "seed", "max_buffered_steps")
    MODE_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_BUFFERED_STEPS_FIELD_NUMBER: _ClassVar[int]
    mode: _worker_pb2.SampleMode
    fragment_length: int
    seed: int
    max_buffered_steps: int
    def __init__(self, mode: _Optional[_Union[_worker_pb2.SampleMode, str]] = ..., fragment_length: _Optional[int] = ..., seed: _Optional[int] = ..., max_buffered_steps: _Optional[int] = ...) -> None: ...

class SampleResponse(_message.Message):
    __slots__ = ("header", "result", "footer", "results_end", "failure", "result_call")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    FOOTER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_END_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    RESULT_CALL_FIELD_NUMBER: _ClassVar[int]
    header: SampleHeader
    result: _worker_pb2.EpisodeResult
    footer: SampleFooter
    results_end: ResultsEnd
    failure: CallFailure
    result_call: int
    def __init__(self, header: _Optional[_Union[SampleHeader, _Mapping]] = ..., result: _Optional[_Union[_worker_pb2.EpisodeResult, _Mapping]] = ..., footer: _Optional[_Union[SampleFooter, _Mapping]] = ..., results_end: _Optional[_Union[ResultsEnd, _Mapping]] = ..., failure: _Optional[_Union[CallFailure, _Mapping]] = ..., result_call: _Optional[int] = ...) -> None: ...

class SampleHeader(_message.Message):
    __slots__ = ("request_id", "env_spec", "agent_version", "env_generation", "coordinator_id", "results_on_data", "footer_on_data")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ENV_SPEC_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENV_GENERATION_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_ON_DATA_FIELD_NUMBER: _ClassVar[int]
    FOOTER_ON_DATA_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    env_spec: _spaces_pb2.EnvSpec
    agent_version: int
    env_generation: int
    coordinator_id: str
    results_on_data: bool
    footer_on_data: bool
    def __init__(self, request_id: _Optional[int] = ..., env_spec: _Optional[_Union[_spaces_pb2.EnvSpec, _Mapping]] = ..., agent_version: _Optional[int] = ..., env_generation: _Optional[int] = ..., coordinator_id: _Optional[str] = ..., results_on_data: _Optional[bool] = ..., footer_on_data: _Optional[bool] = ...) -> None: ...

class SampleFooter(_message.Message):
    __slots__ = ("num_episodes", "total_steps", "workers_used", "reassigned_units", "data_results")
    NUM_EPISODES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_USED_FIELD_NUMBER: _ClassVar[int]
    REASSIGNED_UNITS_FIELD_NUMBER: _ClassVar[int]
    DATA_RESULTS_FIELD_NUMBER: _ClassVar[int]
    num_episodes: int
    total_steps: int
    workers_used: int
    reassigned_units: int
    data_results: int
    def __init__(self, num_episodes: _Optional[int] = ..., total_steps: _Optional[int] = ..., workers_used: _Optional[int] = ..., reassigned_units: _Optional[int] = ..., data_results: _Optional[int] = ...) -> None: ...

class UpdateAck(_message.Message):
    __slots__ = ("agent_version", "env_generation", "workers_updated", "coordinator_id")
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENV_GENERATION_FIELD_NUMBER: _ClassVar[int]
    WORKERS_UPDATED_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    agent_version: int
    env_generation: int
    workers_updated: int
    coordinator_id: str
    def __init__(self, agent_version: _Optional[int] = ..., env_generation: _Optional[int] = ..., workers_updated: _Optional[int] = ..., coordinator_id: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("worker_id", "name", "host", "pid", "peer", "num_envs", "implementation", "capabilities", "state", "agent_version", "env_generation", "steps_total", "steps_per_second", "seconds_since_heartbeat", "units_in_flight", "last_error", "leased_envs")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    NUM_ENVS_FIELD_NUMBER: _ClassVar[int]
    IMPLEMENTATION_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENV_GENERATION_FIELD_NUMBER: _ClassVar[int]
    STEPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    STEPS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    UNITS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    LEASED_ENVS_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    name: str
    host: str
    pid: int
    peer: str
    num_envs: int
    implementation: str
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    state: str
    agent_version: int
    env_generation: int
    steps_total: int
    steps_per_second: float
    seconds_since_heartbeat: float
    units_in_flight: int
    last_error: _updates_pb2.ErrorDetail
    leased_envs: int
    def __init__(self, worker_id: _Optional[int] = ..., name: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., peer: _Optional[str] = ..., num_envs: _Optional[int] = ..., implementation: _Optional[str] = ..., capabilities: _Optional[_Iterable[str]] = ..., state: _Optional[str] = ..., agent_version: _Optional[int] = ..., env_generation: _Optional[int] = ..., steps_total: _Optional[int] = ..., steps_per_second: _Optional[float] = ..., seconds_since_heartbeat: _Optional[float] = ..., units_in_flight: _Optional[int] = ..., last_error: _Optional[_Union[_updates_pb2.ErrorDetail, _Mapping]] = ..., leased_envs: _Optional[int] = ...) -> None: ...

class FleetStatus(_message.Message):
    __slots__ = ("coordinator_id", "protocol_version", "implementation", "workers", "agent_version", "env", "env_spec", "steps_per_second", "steps_total", "requests_in_flight", "subscribers", "draining", "leases", "leased_envs")
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    IMPLEMENTATION_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    ENV_SPEC_FIELD_NUMBER: _ClassVar[int]
    STEPS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    STEPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    LEASED_ENVS_FIELD_NUMBER: _ClassVar[int]
    coordinator_id: str
    protocol_version: int
    implementation: str
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    agent_version: int
    env: _updates_pb2.EnvUpdate
    env_spec: _spaces_pb2.EnvSpec
    steps_per_second: float
    steps_total: int
    requests_in_flight: int
    subscribers: int
    draining: bool
    leases: int
    leased_envs: int
    def __init__(self, coordinator_id: _Optional[str] = ..., protocol_version: _Optional[int] = ..., implementation: _Optional[str] = ..., workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., agent_version: _Optional[int] = ..., env: _Optional[_Union[_updates_pb2.EnvUpdate, _Mapping]] = ..., env_spec: _Optional[_Union[_spaces_pb2.EnvSpec, _Mapping]] = ..., steps_per_second: _Optional[float] = ..., steps_total: _Optional[int] = ..., requests_in_flight: _Optional[int] = ..., subscribers: _Optional[int] = ..., draining: _Optional[bool] = ..., leases: _Optional[int] = ..., leased_envs: _Optional[int] = ...) -> None: ...
