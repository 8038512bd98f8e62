"""Generate the ``nexuscrm`` Python package (messages, stubs, .pyi) from ``protos/``.

Usage: ``python protos/generate.py [OUTPUT_DIR]`` (default: ``protos/python``). The output
root is the proto root, so the absolute imports that ``*_pb2_grpc.py`` files contain
(``from nexuscrm.connectors.v1 import connectors_pb2``) resolve to this package.

The build hook of the nexuscrm-protos distribution (``protos/python/setup.py``) calls
``generate`` too, on this file next to the .proto files (in the repository, or the copy an
sdist carries): one generation step for ``make``, ``pip install`` and every wheel.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
DEFAULT_OUTPUT = PROTO_ROOT / "python"


class GenerationError(Exception):
    """The code could not be generated; the message says what was missing or what failed."""


def proto_files(root: Path = PROTO_ROOT) -> list[str]:
    """The contract's .proto files below ``root``, relative to it, sorted."""
    return sorted(str(p.relative_to(root)) for p in root.glob("nexuscrm/**/*.proto"))


def generate(output: Path) -> list[Path]:
    """Write generated modules below ``output`` and return them, sorted.

    Raises:
        GenerationError: grpc_tools is not installed, no .proto file was found, or protoc failed
            or wrote no module for a .proto file.
    """
    try:
        from grpc_tools import protoc
    except ModuleNotFoundError as error:
        raise GenerationError(
            "grpc_tools is not installed: install the grpcio-tools that nexuscrm-protos's "
            "[build-system] requires (requirements/constraints.txt pins the same)"
        ) from error
    protos = proto_files()
    if not protos:
        raise GenerationError(f"no .proto file found below {PROTO_ROOT / 'nexuscrm'}")
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
        raise GenerationError(f"protoc failed with status {status} on {', '.join(protos)} (its message is above)")
    modules = {proto: (output / proto).with_name(f"{Path(proto).stem}_pb2.py") for proto in protos}
    if missing := [proto for proto, module in modules.items() if not module.is_file()]:
        raise GenerationError(f"protoc wrote no module for {', '.join(missing)}")
    package = output / "nexuscrm"
    for directory in [package, *(d for d in package.rglob("*") if d.is_dir() and d.name != "__pycache__")]:
        (directory / "__init__.py").touch()
    (package / "py.typed").touch()  # PEP 561: the .pyi stubs are the package's types
    return sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUTPUT
    try:
        generated = generate(target)
    except GenerationError as error:
        sys.exit(f"generate.py: {error}")
    for path in generated:
        print(path.relative_to(target))
