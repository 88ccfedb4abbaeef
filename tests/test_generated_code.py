"""The committed generated code must match the .proto files."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "tools" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_in_step_with_protos(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is in the test extra")
    fresh = _load_generator().generate(tmp_path)
    committed = ROOT / "rlfleet" / "v1"
    assert fresh, "protoc generated nothing"
    stale = [
        p.name
        for p in fresh
        if not (committed / p.name).exists() or (committed / p.name).read_bytes() != p.read_bytes()
    ]
    extra = sorted({p.name for p in committed.glob("*_pb2.py*")} - {p.name for p in fresh})
    assert not stale and not extra, (
        f"generated code is out of step with protos/ (stale: {stale}, extra: {extra}); "
        "run `python tools/gen_protos.py` and commit the result"
    )


def test_every_message_is_documented() -> None:
    """Other languages are written from the .proto comments: no bare message."""
    for proto in sorted((ROOT / "protos" / "rlfleet" / "v1").glob("*.proto")):
        lines = proto.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith(("message ", "enum ", "service ")) and not line.startswith(
                ("message TensorMapEntry", "message DictSpaceEntry")
            ):
                above = lines[i - 1].strip() if i else ""
                name = line.split()[1]
                # Plain wrapper messages are documented where they are used.
                if name in {
                    "WorkerMessage",
                    "CoordinatorMessage",
                    "SampleResponse",
                    "StatusRequest",
                    "UpdateAck",
                    "WorkerStatus",
                    "FleetStatus",
                    "SampleRequest",
                    "SubscribeRequest",
                    "Heartbeat",
                    "TensorMap",
                }:
                    continue
                assert above.startswith("//"), f"{proto.name}: {name} has no comment above it"


def test_generated_modules_import() -> None:
    from rlfleet.v1 import batch_pb2, learner_pb2, spaces_pb2, tensor_pb2, updates_pb2, worker_pb2

    for module in (batch_pb2, learner_pb2, spaces_pb2, tensor_pb2, updates_pb2, worker_pb2):
        assert module.DESCRIPTOR.package == "rlfleet.v1", module.__name__
    assert "rlfleet.v1.tensor_pb2" in sys.modules
