"""Agent and env updates and error details: rlfleet types to messages and back."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.errors import WireFormatError
from rlfleet.protocol.error_reports import ErrorKind, ErrorReport, describe_report, kind_name
from rlfleet.protocol.updates import AgentChange, EnvChange, PolicyChoice
from rlfleet.v1 import tensor_pb2, updates_pb2
from rlfleet.wire import (
    decode_agent_update,
    decode_env_update,
    decode_error_detail,
    encode_agent_change,
    encode_env_change,
    encode_error_report,
)
from rlfleet.wire.tensors import TensorDict


def test_error_kinds_mirror_the_contract() -> None:
    contract = {value.number: value.name for value in updates_pb2.ErrorKind.DESCRIPTOR.values}
    assert {kind.value: kind_name(kind) for kind in ErrorKind} == contract


@pytest.mark.parametrize(
    "report",
    [
        ErrorReport(ErrorKind.POLICY),
        ErrorReport(
            ErrorKind.ENV_CRASHED,
            "boom",
            worker="w",
            env_index=0,
            step=0,
            episode_index=3,
            task_id=7,
            traceback="Traceback",
            exception_type="RuntimeError",
            env_generation=0,
            agent_version=2,
        ),
        ErrorReport(99, "a kind of a newer version"),
    ],
)
def test_error_reports_round_trip_with_unset_and_zero_fields_apart(report: ErrorReport) -> None:
    detail = encode_error_report(report)
    assert detail.HasField("env_index") == (report.env_index is not None)
    assert detail.HasField("env_generation") == (report.env_generation is not None)
    parsed = updates_pb2.ErrorDetail.FromString(detail.SerializeToString())
    assert decode_error_detail(parsed) == report


def test_a_report_names_where_it_happened() -> None:
    report = ErrorReport(ErrorKind.ENV_CRASHED, "", worker="w", env_index=1, step=4)
    assert describe_report(report) == "ERROR_KIND_ENV_CRASHED (worker 'w', env 1, step 4)"


def test_agent_changes_round_trip() -> None:
    params: TensorDict = {
        "a": np.arange(3, dtype=np.float32),
        "nested": {"b": np.ones((2, 2), np.int64)},
    }
    change = AgentChange(5, PolicyChoice("mlp-categorical", '{"hidden_sizes": [4]}'), params)
    message = encode_agent_change(change)
    back = decode_agent_update(updates_pb2.AgentUpdate.FromString(message.SerializeToString()))
    assert (back.version, back.policy, back.pickled_policy) == (5, change.policy, b"")
    np.testing.assert_array_equal(back.params["a"], params["a"])
    np.testing.assert_array_equal(back.params["nested"]["b"], params["nested"]["b"])

    bare = decode_agent_update(encode_agent_change(AgentChange(pickled_policy=b"\x80")))
    assert (bare.policy, bare.params, bare.pickled_policy) == (None, {}, b"\x80")


def test_a_malformed_parameter_is_a_wire_format_error_naming_it() -> None:
    update = updates_pb2.AgentUpdate(
        params=tensor_pb2.TensorMap(
            entries=[
                tensor_pb2.TensorMapEntry(
                    key="w", tensor=tensor_pb2.Tensor(dtype=tensor_pb2.DTYPE_FLOAT32, shape=[2])
                )
            ]
        )
    )
    with pytest.raises(WireFormatError, match=r"AgentUpdate.params\['w'\]"):
        decode_agent_update(update)


@pytest.mark.parametrize("length", [None, 0, 200])
def test_env_changes_round_trip(length: int | None) -> None:
    change = EnvChange(3, "CartPole-v1", '{"a": 1}', length, b"", "vector_entry_point")
    message = encode_env_change(change)
    assert message.HasField("max_episode_length") == (length is not None)
    assert decode_env_update(updates_pb2.EnvUpdate.FromString(message.SerializeToString())) == (
        change
    )
