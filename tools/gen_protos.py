"""Generates rlfleet/v1/*_pb2.py(i) from protos/rlfleet/v1/*.proto.

Run from anywhere: ``python tools/gen_protos.py`` (needs grpcio-tools, the
``test`` extra). The generated code is committed so users need no compiler;
``tests/test_generated_code.py`` fails when it is out of step with the
.proto files. No gRPC stubs are generated on purpose: rlfleet's coordinator,
worker and client bind methods with their own (zero-copy) serializers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"


def generate(out_dir: Path) -> list[Path]:
    """Runs protoc into ``out_dir`` and returns the files it wrote."""
    from grpc_tools import protoc  # imported late: a test-only dependency

    protos = sorted(PROTO_ROOT.glob("rlfleet/v1/*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        *map(str, protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {[p.name for p in protos]}")
    return sorted((out_dir / "rlfleet" / "v1").glob("*_pb2.py*"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT, help="output root (default: repo)")
    args = parser.parse_args()
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
