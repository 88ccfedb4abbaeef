from rlfleet.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_KIND_UNSPECIFIED: _ClassVar[ErrorKind]
    ERROR_KIND_ENV_NOT_FOUND: _ClassVar[ErrorKind]
    ERROR_KIND_ENV_CONFIG: _ClassVar[ErrorKind]
    ERROR_KIND_ENV_CRASHED: _ClassVar[ErrorKind]
    ERROR_KIND_POLICY: _ClassVar[ErrorKind]
    ERROR_KIND_NONFINITE: _ClassVar[ErrorKind]
    ERROR_KIND_PROTOCOL: _ClassVar[ErrorKind]
    ERROR_KIND_VERSION: _ClassVar[ErrorKind]
    ERROR_KIND_INTERNAL: _ClassVar[ErrorKind]
    ERROR_KIND_PERMISSION: _ClassVar[ErrorKind]
    ERROR_KIND_NO_WORKERS: _ClassVar[ErrorKind]
    ERROR_KIND_LIMIT: _ClassVar[ErrorKind]
    ERROR_KIND_COORDINATOR_RESTARTED: _ClassVar[ErrorKind]
ERROR_KIND_UNSPECIFIED: ErrorKind
ERROR_KIND_ENV_NOT_FOUND: ErrorKind
ERROR_KIND_ENV_CONFIG: ErrorKind
ERROR_KIND_ENV_CRASHED: ErrorKind
ERROR_KIND_POLICY: ErrorKind
ERROR_KIND_NONFINITE: ErrorKind
ERROR_KIND_PROTOCOL: ErrorKind
ERROR_KIND_VERSION: ErrorKind
ERROR_KIND_INTERNAL: ErrorKind
ERROR_KIND_PERMISSION: ErrorKind
ERROR_KIND_NO_WORKERS: ErrorKind
ERROR_KIND_LIMIT: ErrorKind
ERROR_KIND_COORDINATOR_RESTARTED: ErrorKind

class PolicySpec(_message.Message):
    __slots__ = ("name", "kwargs_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    kwargs_json: str
    def __init__(self, name: _Optional[str] = ..., kwargs_json: _Optional[str] = ...) -> None: ...

class AgentUpdate(_message.Message):
    __slots__ = ("version", "policy", "params", "pickled_policy", "coordinator_id")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    PICKLED_POLICY_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    version: int
    policy: PolicySpec
    params: _tensor_pb2.TensorMap
    pickled_policy: bytes
    coordinator_id: str
    def __init__(self, version: _Optional[int] = ..., policy: _Optional[_Union[PolicySpec, _Mapping]] = ..., params: _Optional[_Union[_tensor_pb2.TensorMap, _Mapping]] = ..., pickled_policy: _Optional[bytes] = ..., coordinator_id: _Optional[str] = ...) -> None: ...

class EnvUpdate(_message.Message):
    __slots__ = ("generation", "env_id", "kwargs_json", "max_episode_length", "pickled_env_factory", "coordinator_id", "vectorization")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    MAX_EPISODE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    PICKLED_ENV_FACTORY_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    VECTORIZATION_FIELD_NUMBER: _ClassVar[int]
    generation: int
    env_id: str
    kwargs_json: str
    max_episode_length: int
    pickled_env_factory: bytes
    coordinator_id: str
    vectorization: str
    def __init__(self, generation: _Optional[int] = ..., env_id: _Optional[str] = ..., kwargs_json: _Optional[str] = ..., max_episode_length: _Optional[int] = ..., pickled_env_factory: _Optional[bytes] = ..., coordinator_id: _Optional[str] = ..., vectorization: _Optional[str] = ...) -> None: ...

class ErrorDetail(_message.Message):
    __slots__ = ("kind", "message", "worker", "env_index", "step", "episode_index", "task_id", "traceback", "exception_type", "env_generation", "agent_version")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    ENV_INDEX_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    EPISODE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    EXCEPTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    ENV_GENERATION_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    kind: ErrorKind
    message: str
    worker: str
    env_index: int
    step: int
    episode_index: int
    task_id: int
    traceback: str
    exception_type: str
    env_generation: int
    agent_version: int
    def __init__(self, kind: _Optional[_Union[ErrorKind, str]] = ..., message: _Optional[str] = ..., worker: _Optional[str] = ..., env_index: _Optional[int] = ..., step: _Optional[int] = ..., episode_index: _Optional[int] = ..., task_id: _Optional[int] = ..., traceback: _Optional[str] = ..., exception_type: _Optional[str] = ..., env_generation: _Optional[int] = ..., agent_version: _Optional[int] = ...) -> None: ...
