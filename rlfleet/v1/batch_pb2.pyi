from rlfleet.v1 import spaces_pb2 as _spaces_pb2
from rlfleet.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StepType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_TYPE_FIRST: _ClassVar[StepType]
    STEP_TYPE_MID: _ClassVar[StepType]
    STEP_TYPE_TERMINAL: _ClassVar[StepType]
    STEP_TYPE_TIMEOUT: _ClassVar[StepType]

class PayloadKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAYLOAD_KIND_UNSPECIFIED: _ClassVar[PayloadKind]
    PAYLOAD_KIND_EPISODE_BATCH: _ClassVar[PayloadKind]
    PAYLOAD_KIND_TIME_STEP_BATCH: _ClassVar[PayloadKind]
STEP_TYPE_FIRST: StepType
STEP_TYPE_MID: StepType
STEP_TYPE_TERMINAL: StepType
STEP_TYPE_TIMEOUT: StepType
PAYLOAD_KIND_UNSPECIFIED: PayloadKind
PAYLOAD_KIND_EPISODE_BATCH: PayloadKind
PAYLOAD_KIND_TIME_STEP_BATCH: PayloadKind

class EpisodeBatch(_message.Message):
    __slots__ = ("env_spec", "episode_infos", "observations", "last_observations", "actions", "rewards", "env_infos", "agent_infos", "step_types", "lengths")
    ENV_SPEC_FIELD_NUMBER: _ClassVar[int]
    EPISODE_INFOS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    LAST_OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    ENV_INFOS_FIELD_NUMBER: _ClassVar[int]
    AGENT_INFOS_FIELD_NUMBER: _ClassVar[int]
    STEP_TYPES_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    env_spec: _spaces_pb2.EnvSpec
    episode_infos: _tensor_pb2.TensorMap
    observations: _tensor_pb2.Tensor
    last_observations: _tensor_pb2.Tensor
    actions: _tensor_pb2.Tensor
    rewards: _tensor_pb2.Tensor
    env_infos: _tensor_pb2.TensorMap
    agent_infos: _tensor_pb2.TensorMap
    step_types: _tensor_pb2.Tensor
    lengths: _tensor_pb2.Tensor
    def __init__(self, env_spec: _Optional[_Union[_spaces_pb2.EnvSpec, _Mapping]] = ..., episode_infos: _Optional[_Union[_tensor_pb2.TensorMap, _Mapping]] = ..., observations: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., last_observations: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., actions: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., rewards: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., env_infos: _Optional[_Union[_tensor_pb2.TensorMap, _Mapping]] = ..., agent_infos: _Optional[_Union[_tensor_pb2.TensorMap, _Mapping]] = ..., step_types: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., lengths: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class TimeStepBatch(_message.Message):
    __slots__ = ("env_spec", "episode_infos", "observations", "actions", "rewards", "next_observations", "env_infos", "agent_infos", "step_types")
    ENV_SPEC_FIELD_NUMBER: _ClassVar[int]
    EPISODE_INFOS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    ENV_INFOS_FIELD_NUMBER: _ClassVar[int]
    AGENT_INFOS_FIELD_NUMBER: _ClassVar[int]
    STEP_TYPES_FIELD_NUMBER: _ClassVar[int]
    env_spec: _spaces_pb2.EnvSpec
    episode_infos: _tensor_pb2.TensorMap
    observations: _tensor_pb2.Tensor
    actions: _tensor_pb2.Tensor
    rewards: _tensor_pb2.Tensor
    next_observations: _tensor_pb2.Tensor
    env_infos: _tensor_pb2.TensorMap
    agent_infos: _tensor_pb2.TensorMap
    step_types: _tensor_pb2.Tensor
    def __init__(self, env_spec: _Optional[_Union[_spaces_pb2.EnvSpec, _Mapping]] = ..., episode_infos: _Optional[_Union[_tensor_pb2.TensorMap, _Mapping]] = ..., observations: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., actions: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., rewards: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., next_observations: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., env_infos: _Optional[_Union[_tensor_pb2.TensorMap, _Mapping]] = ..., agent_infos: _Optional[_Union[_tensor_pb2.TensorMap, _Mapping]] = ..., step_types: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class BatchChunk(_message.Message):
    __slots__ = ("batch_id", "index", "count", "total_bytes", "kind", "data")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    index: int
    count: int
    total_bytes: int
    kind: PayloadKind
    data: bytes
    def __init__(self, batch_id: _Optional[int] = ..., index: _Optional[int] = ..., count: _Optional[int] = ..., total_bytes: _Optional[int] = ..., kind: _Optional[_Union[PayloadKind, str]] = ..., data: _Optional[bytes] = ...) -> None: ...
