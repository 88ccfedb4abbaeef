"""What the issues and the docs promise is importable from ``rlfleet``."""

from __future__ import annotations

import subprocess
import sys

import rlfleet

PROMISED = [
    # garage's data types
    "EpisodeBatch", "TimeStep", "TimeStepBatch", "StepType", "EnvSpec", "InOutSpec",
    # workers and samplers, garage's contract
    "DefaultWorker", "VecWorker", "LocalSampler",
    # garage's sampling utilities
    "rollout", "truncate_paths", "obtain_evaluation_episodes", "log_performance",
    "log_multitask_performance",
    # garage's Trainer
    "Trainer", "SnapshotConfig", "wrap_experiment", "ExperimentContext", "NotSetupError",
    # envs and policies
    "EnvConfig", "PolicySpec", "Policy", "RlfleetError",
    # tianshou's vector envs (issue 11): the in-process alias, and what a backend needs
    "BaseVectorEnv", "DummyVectorEnv", "VectorEnv", "SubprocVectorEnv", "FailedCall",
    # the native backend (gymnasium's vector_entry_point, envpool) behind the same API (issue 15)
    "NativeVectorEnv",
    # batch files (rlfleet sample's .npz)
    "load_batch", "save_batch",
    # RLlib's RolloutWorker surface (issue 14)
    "RolloutWorker", "MultiAgentEpisodeBatch",
    # multi-agent on the fleet (issue 14 section 3)
    "register_multi_agent_env",
    # fragment streams moved between workers (issue 12.6)
    "StreamReplay", "StreamBook",
    # a policy's per-row draws, drawn a block per episode by workers (issue 15)
    "RowDraws",
]  # fmt: skip


def test_promised_names_are_exported() -> None:
    missing = [name for name in PROMISED if name not in rlfleet.__all__]
    assert not missing, f"rlfleet.__all__ lacks {missing}"
    assert all(hasattr(rlfleet, name) for name in rlfleet.__all__)


def test_core_types_import_without_grpc() -> None:
    """The pure data types depend on numpy only: no gRPC or protobuf loaded."""
    code = (
        "import sys; import rlfleet.core; "
        "bad = [m for m in ('grpc', 'google.protobuf') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    ).stdout.strip()
    assert out == "", f"importing rlfleet.core loaded {out}"


def test_the_client_exports_the_fleet_faces() -> None:
    """gRPC-bound names live in rlfleet.client (importing rlfleet loads no gRPC)."""
    import rlfleet.client

    promised = ["Fleet", "RemoteSampler", "RemoteVectorEnv", "FleetStatus"]
    missing = [name for name in promised if name not in rlfleet.client.__all__]
    assert not missing, f"rlfleet.client.__all__ lacks {missing}"
