"""Generate the ``nexuscrm`` Python package (messages, stubs, .pyi) from ``protos/``.

Usage: ``python protos/generate.py [OUTPUT_DIR]`` (default: ``protos/python``). The output
root is the proto root, so the absolute imports that ``*_pb2_grpc.py`` files contain
(``from nexuscrm.connectors.v1 import connectors_pb2``) resolve to this package.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent
DEFAULT_OUTPUT = PROTO_ROOT / "python"


def generate(output: Path) -> list[Path]:
    """Write generated modules below ``output`` and return them, sorted."""
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.glob("nexuscrm/**/*.proto"))
    include = Path(protoc.__file__).parent / "_proto"  # google/protobuf well-known types
    output.mkdir(parents=True, exist_ok=True)
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={output}",
            f"--pyi_out={output}",
            f"--grpc_python_out={output}",
            *protos,
        ]
    )
    if status != 0:
        raise SystemExit(f"protoc failed with status {status}")
    package = output / "nexuscrm"
    for directory in [package, *(d for d in package.rglob("*") if d.is_dir())]:
        (directory / "__init__.py").touch()
    return sorted(p for p in package.rglob("*") if p.is_file())


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUTPUT
    for path in generate(target):
        print(path.relative_to(target))
