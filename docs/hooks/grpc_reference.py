"""The gRPC reference, rendered from the .proto files' own comments.

``protoc --descriptor_set_out --include_source_info`` (grpcio-tools, the compiler that
generates the Python code) parses the contract; each service, RPC, message, field, enum and
enum value is listed with the comment written above it in its .proto file. Nothing is parsed
by hand: the comments are the descriptor set's source locations.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from google.protobuf import descriptor_pb2

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "protos"))
from generate import PROTO_ROOT, proto_files  # noqa: E402  # protos/generate.py: the contract's file list

# Paths into a FileDescriptorProto (descriptor.proto's field numbers), as source info names them.
MESSAGE_TYPE, ENUM_TYPE, SERVICE = 4, 5, 6
FIELD, NESTED_TYPE, NESTED_ENUM, ONEOF = 2, 3, 4, 8
ENUM_VALUE, METHOD = 2, 2

LABELS = {descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED: "repeated "}
SCALARS = {
    value: name.removeprefix("TYPE_").lower()
    for name, value in descriptor_pb2.FieldDescriptorProto.Type.items()
    if name not in ("TYPE_MESSAGE", "TYPE_ENUM", "TYPE_GROUP")
}


def descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    """The contract's files, parsed by protoc with their comments."""
    from grpc_tools import protoc

    include = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "contract.pb"
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{PROTO_ROOT}",
                f"-I{include}",
                f"--descriptor_set_out={out}",
                "--include_source_info",
                *proto_files(),
            ]
        )
        if status != 0:
            raise RuntimeError(f"protoc failed with status {status} on the contract")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


class Comments:
    """A file's comments by descriptor path (leading comment, else trailing)."""

    def __init__(self, file: descriptor_pb2.FileDescriptorProto) -> None:
        self._by_path = {
            tuple(location.path): "\n".join(
                line.strip() for line in (location.leading_comments or location.trailing_comments).strip().splitlines()
            )
            for location in file.source_code_info.location
        }

    def __call__(self, path: Sequence[int]) -> str:
        return self._by_path.get(tuple(path), "")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def _anchor(full_name: str) -> str:
    return full_name.lower().replace(".", "")


def _type_name(field: descriptor_pb2.FieldDescriptorProto, local: set[str]) -> str:
    label = LABELS.get(field.label, "")
    if field.type in SCALARS:
        return f"{label}{SCALARS[field.type]}"
    return f"{label}{_reference(field.type_name, local)}"


def _reference(type_name: str, local: set[str]) -> str:
    """A message or enum type: a link to its section on this page, else its full name."""
    name = type_name.lstrip(".")
    return f"[{name.rsplit('.', 1)[-1]}](#{_anchor(name)})" if name in local else f"`{name}`"


def _message(
    message: descriptor_pb2.DescriptorProto, prefix: str, path: list[int], comments: Comments, local: set[str]
) -> Iterator[str]:
    full = f"{prefix}.{message.name}"
    yield f"### {message.name} {{#{_anchor(full)}}}"
    yield ""
    yield f"`{full}`"
    yield ""
    if text := comments(path):
        yield text
        yield ""
    if message.field:
        yield "| field | number | type | what |"
        yield "|---|---|---|---|"
        for index, field in enumerate(message.field):
            oneof = (
                f" (one of `{message.oneof_decl[field.oneof_index].name}`)"
                if field.HasField("oneof_index") and not field.proto3_optional
                else ""
            )
            what = _cell(comments([*path, FIELD, index])) + oneof
            yield f"| `{field.name}` | {field.number} | {_type_name(field, local)} | {what} |"
        yield ""
    for index, enum in enumerate(message.enum_type):
        yield from _enum(enum, full, [*path, NESTED_ENUM, index], comments)
    for index, nested in enumerate(message.nested_type):
        if not nested.options.map_entry:
            yield from _message(nested, full, [*path, NESTED_TYPE, index], comments, local)


def _enum(enum: descriptor_pb2.EnumDescriptorProto, prefix: str, path: list[int], comments: Comments) -> Iterator[str]:
    full = f"{prefix}.{enum.name}"
    yield f"### {enum.name} {{#{_anchor(full)}}}"
    yield ""
    yield f"`{full}` (enum)"
    yield ""
    if text := comments(path):
        yield text
        yield ""
    yield "| value | number | what |"
    yield "|---|---|---|"
    for index, value in enumerate(enum.value):
        yield f"| `{value.name}` | {value.number} | {_cell(comments([*path, ENUM_VALUE, index]))} |"
    yield ""


def _local_names(file: descriptor_pb2.FileDescriptorProto) -> set[str]:
    names: set[str] = set()

    def add(prefix: str, messages: Sequence[descriptor_pb2.DescriptorProto]) -> None:
        for message in messages:
            names.add(f"{prefix}.{message.name}")
            names.update(f"{prefix}.{message.name}.{enum.name}" for enum in message.enum_type)
            add(f"{prefix}.{message.name}", message.nested_type)

    add(file.package, file.message_type)
    names.update(f"{file.package}.{enum.name}" for enum in file.enum_type)
    return names


def render_file(file: descriptor_pb2.FileDescriptorProto) -> list[str]:
    """One .proto file's section: its services with their RPCs, then messages and enums."""
    comments = Comments(file)
    local = _local_names(file)
    lines = [f"## `{file.package}`", "", f"From `protos/{file.name}`.", ""]
    for s_index, service in enumerate(file.service):
        full = f"{file.package}.{service.name}"
        lines += [f"### {service.name} {{#{_anchor(full)}}}", "", f"`{full}` (service)", ""]
        if text := comments([SERVICE, s_index]):
            lines += [text, ""]
        lines += ["| RPC | request | response |", "|---|---|---|"]
        for method in service.method:
            response = _reference(method.output_type, local)
            stream = "stream " if method.server_streaming else ""
            link = f"[`{method.name}`](#{_anchor(f'{full}.{method.name}')})"
            lines.append(f"| {link} | {_reference(method.input_type, local)} | {stream}{response} |")
        lines.append("")
        for m_index, method in enumerate(service.method):
            lines += [f"#### {service.name}.{method.name} {{#{_anchor(f'{full}.{method.name}')}}}", ""]
            if text := comments([SERVICE, s_index, METHOD, m_index]):
                lines += [text, ""]
    for index, message in enumerate(file.message_type):
        lines += _message(message, file.package, [MESSAGE_TYPE, index], comments, local)
    for index, enum in enumerate(file.enum_type):
        lines += _enum(enum, file.package, [ENUM_TYPE, index], comments)
    return lines


def render() -> str:
    """The whole gRPC reference page."""
    lines = [
        "# gRPC API",
        "",
        "Generated at build time from the .proto files under `protos/nexuscrm/` and the comments",
        "written in them (`docs/hooks/grpc_reference.py`): every service, RPC, message, field and",
        "enum value of the contract. Versioning rules: `protos/CHANGELOG.md`.",
        "",
    ]
    for file in descriptor_set().file:
        lines += render_file(file)
    return "\n".join(lines) + "\n"
