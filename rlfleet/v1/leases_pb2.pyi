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

class LeaseOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_OP_UNSPECIFIED: _ClassVar[LeaseOp]
    LEASE_OP_CREATE: _ClassVar[LeaseOp]
    LEASE_OP_RESET: _ClassVar[LeaseOp]
    LEASE_OP_STEP: _ClassVar[LeaseOp]
    LEASE_OP_RENDER: _ClassVar[LeaseOp]
    LEASE_OP_GET_ATTR: _ClassVar[LeaseOp]
    LEASE_OP_SET_ATTR: _ClassVar[LeaseOp]
    LEASE_OP_CALL: _ClassVar[LeaseOp]
    LEASE_OP_CLASS_NAMES: _ClassVar[LeaseOp]
LEASE_OP_UNSPECIFIED: LeaseOp
LEASE_OP_CREATE: LeaseOp
LEASE_OP_RESET: LeaseOp
LEASE_OP_STEP: LeaseOp
LEASE_OP_RENDER: LeaseOp
LEASE_OP_GET_ATTR: LeaseOp
LEASE_OP_SET_ATTR: LeaseOp
LEASE_OP_CALL: LeaseOp
LEASE_OP_CLASS_NAMES: LeaseOp

class LeaseRequest(_message.Message):
    __slots__ = ("open", "call", "close")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    open: LeaseOpen
    call: LeaseCall
    close: LeaseClose
    def __init__(self, open: _Optional[_Union[LeaseOpen, _Mapping]] = ..., call: _Optional[_Union[LeaseCall, _Mapping]] = ..., close: _Optional[_Union[LeaseClose, _Mapping]] = ...) -> None: ...

class LeaseResponse(_message.Message):
    __slots__ = ("opened", "reply", "replies")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    opened: LeaseOpened
    reply: LeaseReply
    replies: LeaseReplies
    def __init__(self, opened: _Optional[_Union[LeaseOpened, _Mapping]] = ..., reply: _Optional[_Union[LeaseReply, _Mapping]] = ..., replies: _Optional[_Union[LeaseReplies, _Mapping]] = ...) -> None: ...

class LeaseReplies(_message.Message):
    __slots__ = ("replies",)
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[LeaseReply]
    def __init__(self, replies: _Optional[_Iterable[_Union[LeaseReply, _Mapping]]] = ...) -> None: ...

class LeaseOpen(_message.Message):
    __slots__ = ("env", "num_envs", "timeout_seconds", "learner")
    ENV_FIELD_NUMBER: _ClassVar[int]
    NUM_ENVS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    env: _updates_pb2.EnvUpdate
    num_envs: int
    timeout_seconds: float
    learner: str
    def __init__(self, env: _Optional[_Union[_updates_pb2.EnvUpdate, _Mapping]] = ..., num_envs: _Optional[int] = ..., timeout_seconds: _Optional[float] = ..., learner: _Optional[str] = ...) -> None: ...

class LeaseOpened(_message.Message):
    __slots__ = ("lease_id", "env_spec", "env_workers", "data", "env_specs")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    ENV_SPEC_FIELD_NUMBER: _ClassVar[int]
    ENV_WORKERS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    ENV_SPECS_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    env_spec: _spaces_pb2.EnvSpec
    env_workers: _containers.RepeatedScalarFieldContainer[str]
    data: LeaseDataAddress
    env_specs: _containers.RepeatedCompositeFieldContainer[_spaces_pb2.EnvSpec]
    def __init__(self, lease_id: _Optional[int] = ..., env_spec: _Optional[_Union[_spaces_pb2.EnvSpec, _Mapping]] = ..., env_workers: _Optional[_Iterable[str]] = ..., data: _Optional[_Union[LeaseDataAddress, _Mapping]] = ..., env_specs: _Optional[_Iterable[_Union[_spaces_pb2.EnvSpec, _Mapping]]] = ...) -> None: ...

class LeaseCall(_message.Message):
    __slots__ = ("call_id", "op", "env_ids", "seeds", "options_json", "actions", "name", "value_json", "prefetch_reset", "whole_reply")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    ENV_IDS_FIELD_NUMBER: _ClassVar[int]
    SEEDS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_JSON_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_RESET_FIELD_NUMBER: _ClassVar[int]
    WHOLE_REPLY_FIELD_NUMBER: _ClassVar[int]
    call_id: int
    op: LeaseOp
    env_ids: _containers.RepeatedScalarFieldContainer[int]
    seeds: _containers.RepeatedScalarFieldContainer[int]
    options_json: str
    actions: _tensor_pb2.Tensor
    name: str
    value_json: str
    prefetch_reset: bool
    whole_reply: bool
    def __init__(self, call_id: _Optional[int] = ..., op: _Optional[_Union[LeaseOp, str]] = ..., env_ids: _Optional[_Iterable[int]] = ..., seeds: _Optional[_Iterable[int]] = ..., options_json: _Optional[str] = ..., actions: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., name: _Optional[str] = ..., value_json: _Optional[str] = ..., prefetch_reset: _Optional[bool] = ..., whole_reply: _Optional[bool] = ...) -> None: ...

class LeaseClose(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LeaseReply(_message.Message):
    __slots__ = ("call_id", "op", "env_ids", "observations", "rewards", "terminated", "truncated", "infos", "error", "lease_id", "worker", "env_spec", "values_json", "frames", "infos_json", "reset_env_ids", "reset_observations", "reset_infos", "reset_infos_json", "env_specs", "observations_pickle", "infos_pickle", "values_pickle", "reset_observations_pickle", "reset_infos_pickle")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    ENV_IDS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    INFOS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    ENV_SPEC_FIELD_NUMBER: _ClassVar[int]
    VALUES_JSON_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    INFOS_JSON_FIELD_NUMBER: _ClassVar[int]
    RESET_ENV_IDS_FIELD_NUMBER: _ClassVar[int]
    RESET_OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    RESET_INFOS_FIELD_NUMBER: _ClassVar[int]
    RESET_INFOS_JSON_FIELD_NUMBER: _ClassVar[int]
    ENV_SPECS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_PICKLE_FIELD_NUMBER: _ClassVar[int]
    INFOS_PICKLE_FIELD_NUMBER: _ClassVar[int]
    VALUES_PICKLE_FIELD_NUMBER: _ClassVar[int]
    RESET_OBSERVATIONS_PICKLE_FIELD_NUMBER: _ClassVar[int]
    RESET_INFOS_PICKLE_FIELD_NUMBER: _ClassVar[int]
    call_id: int
    op: LeaseOp
    env_ids: _containers.RepeatedScalarFieldContainer[int]
    observations: _tensor_pb2.Tensor
    rewards: _tensor_pb2.Tensor
    terminated: _tensor_pb2.Tensor
    truncated: _tensor_pb2.Tensor
    infos: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.TensorMap]
    error: _updates_pb2.ErrorDetail
    lease_id: int
    worker: str
    env_spec: _spaces_pb2.EnvSpec
    values_json: _containers.RepeatedScalarFieldContainer[str]
    frames: _tensor_pb2.Tensor
    infos_json: _containers.RepeatedScalarFieldContainer[str]
    reset_env_ids: _containers.RepeatedScalarFieldContainer[int]
    reset_observations: _tensor_pb2.Tensor
    reset_infos: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.TensorMap]
    reset_infos_json: _containers.RepeatedScalarFieldContainer[str]
    env_specs: _containers.RepeatedCompositeFieldContainer[_spaces_pb2.EnvSpec]
    observations_pickle: _containers.RepeatedScalarFieldContainer[bytes]
    infos_pickle: _containers.RepeatedScalarFieldContainer[bytes]
    values_pickle: _containers.RepeatedScalarFieldContainer[bytes]
    reset_observations_pickle: _containers.RepeatedScalarFieldContainer[bytes]
    reset_infos_pickle: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, call_id: _Optional[int] = ..., op: _Optional[_Union[LeaseOp, str]] = ..., env_ids: _Optional[_Iterable[int]] = ..., observations: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., rewards: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., terminated: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., truncated: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., infos: _Optional[_Iterable[_Union[_tensor_pb2.TensorMap, _Mapping]]] = ..., error: _Optional[_Union[_updates_pb2.ErrorDetail, _Mapping]] = ..., lease_id: _Optional[int] = ..., worker: _Optional[str] = ..., env_spec: _Optional[_Union[_spaces_pb2.EnvSpec, _Mapping]] = ..., values_json: _Optional[_Iterable[str]] = ..., frames: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., infos_json: _Optional[_Iterable[str]] = ..., reset_env_ids: _Optional[_Iterable[int]] = ..., reset_observations: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., reset_infos: _Optional[_Iterable[_Union[_tensor_pb2.TensorMap, _Mapping]]] = ..., reset_infos_json: _Optional[_Iterable[str]] = ..., env_specs: _Optional[_Iterable[_Union[_spaces_pb2.EnvSpec, _Mapping]]] = ..., observations_pickle: _Optional[_Iterable[bytes]] = ..., infos_pickle: _Optional[_Iterable[bytes]] = ..., values_pickle: _Optional[_Iterable[bytes]] = ..., reset_observations_pickle: _Optional[_Iterable[bytes]] = ..., reset_infos_pickle: _Optional[_Iterable[bytes]] = ...) -> None: ...

class LeaseCommand(_message.Message):
    __slots__ = ("lease_id", "create", "call", "release", "data_switch")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    DATA_SWITCH_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    create: LeaseCreate
    call: LeaseCall
    release: LeaseRelease
    data_switch: LeaseDataSwitch
    def __init__(self, lease_id: _Optional[int] = ..., create: _Optional[_Union[LeaseCreate, _Mapping]] = ..., call: _Optional[_Union[LeaseCall, _Mapping]] = ..., release: _Optional[_Union[LeaseRelease, _Mapping]] = ..., data_switch: _Optional[_Union[LeaseDataSwitch, _Mapping]] = ...) -> None: ...

class LeaseCreate(_message.Message):
    __slots__ = ("env", "env_ids", "replaces_lost")
    ENV_FIELD_NUMBER: _ClassVar[int]
    ENV_IDS_FIELD_NUMBER: _ClassVar[int]
    REPLACES_LOST_FIELD_NUMBER: _ClassVar[int]
    env: _updates_pb2.EnvUpdate
    env_ids: _containers.RepeatedScalarFieldContainer[int]
    replaces_lost: bool
    def __init__(self, env: _Optional[_Union[_updates_pb2.EnvUpdate, _Mapping]] = ..., env_ids: _Optional[_Iterable[int]] = ..., replaces_lost: _Optional[bool] = ...) -> None: ...

class LeaseRelease(_message.Message):
    __slots__ = ("env_ids",)
    ENV_IDS_FIELD_NUMBER: _ClassVar[int]
    env_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, env_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class LeaseDataAddress(_message.Message):
    __slots__ = ("port", "ticket")
    PORT_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    port: int
    ticket: bytes
    def __init__(self, port: _Optional[int] = ..., ticket: _Optional[bytes] = ...) -> None: ...

class LeaseDataHello(_message.Message):
    __slots__ = ("ticket",)
    TICKET_FIELD_NUMBER: _ClassVar[int]
    ticket: bytes
    def __init__(self, ticket: _Optional[bytes] = ...) -> None: ...

class LeaseDataAccepted(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LeaseDataSwitch(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
