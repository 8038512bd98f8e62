"""Every distribution builds from a clean tree into a wheel a registry would accept.

The ten wheels are built once, from a copy of the working tree without ignored files (so
without the generated ``protos/python/nexuscrm``), with this environment's setuptools and
grpcio-tools. Each carries its modules with py.typed, the licence file and the metadata of a
published package; the protos wheel carries the code its build generated and the hand-written
``nexuscrm_wire``, and declares the runtimes that code checks for. The protos sdist carries the
contract and builds the same wheel on its own; a protos build that cannot generate fails naming why
(docs/decisions/143-owners-versions-and-ranges.md).
"""

from __future__ import annotations

import email
import email.message
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.architecture.distributions import build_wheels, copy_clean_tree, pip_wheel
from tests.architecture.packages import PACKAGE_DIRS, REPO_ROOT, Package, load_packages

pytestmark = pytest.mark.slow

PROTOS = "nexuscrm-protos"
URL_LABELS = ("Homepage", "Documentation", "Changelog", "Source")
REFUSAL = "nexuscrm-protos: cannot generate the gRPC code"
# What the generated code checks at import (grpc_tools' code generator writes both).
GRPC_GENERATED = re.compile(r"^GRPC_GENERATED_VERSION = '([0-9.]+)'$", re.MULTILINE)
PROTOBUF_GENCODE = re.compile(
    r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),"
)
SDIST_HOOK = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_clean_tree(tmp_path_factory.mktemp("clean") / "tree")


@pytest.fixture(scope="module")
def packages(tree: Path) -> dict[str, Package]:
    return load_packages(tree)


@pytest.fixture(scope="module")
def wheels(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    built = build_wheels(tree, PACKAGE_DIRS, tmp_path_factory.mktemp("dist"))
    for wheel in sorted(built.values()):
        print(f"{wheel.name}: {', '.join(sorted(zipfile.ZipFile(wheel).namelist()))}")
    return built


def files_of(wheel: Path) -> list[str]:
    return sorted(zipfile.ZipFile(wheel).namelist())


def metadata_of(wheel: Path) -> email.message.Message:
    archive = zipfile.ZipFile(wheel)
    (path,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    return email.message_from_bytes(archive.read(path))


def generated_files(tree: Path) -> list[str]:
    """What the protos wheel must hold: the code generated for the tree's .proto files, and nexuscrm_wire as written."""
    wire = tree / "protos" / "python" / "nexuscrm_wire"
    expected = {"nexuscrm/py.typed", *(f"nexuscrm_wire/{p.name}" for p in wire.iterdir() if p.is_file())}
    for proto in (tree / "protos").glob("nexuscrm/**/*.proto"):
        relative = proto.relative_to(tree / "protos")
        stem = relative.with_suffix("").as_posix()
        expected |= {f"{stem}_pb2.py", f"{stem}_pb2_grpc.py", f"{stem}_pb2.pyi"}
        expected |= {f"{'/'.join(relative.parts[:n])}/__init__.py" for n in range(1, len(relative.parts))}
    return sorted(expected)


def test_every_distribution_builds_a_wheel(packages: dict[str, Package], wheels: dict[str, Path]) -> None:
    assert set(wheels) == set(packages)
    for name, wheel in wheels.items():
        assert wheel.name.startswith(f"{name.replace('-', '_')}-{packages[name].version}-py3-none-any"), wheel.name


@pytest.mark.parametrize("directory", PACKAGE_DIRS)
def test_wheel_carries_modules_types_licence_and_metadata(
    directory: str, tree: Path, packages: dict[str, Package], wheels: dict[str, Path]
) -> None:
    (package,) = [p for p in packages.values() if p.directory == tree / directory]
    wheel = wheels[package.name]
    files = files_of(wheel)
    dist_info = f"{package.name.replace('-', '_')}-{package.version}.dist-info"
    for module in package.modules:
        assert [f for f in files if f.startswith(f"{module}/") and f.endswith(".py")], files
        assert f"{module}/py.typed" in files, files
    assert zipfile.ZipFile(wheel).read(f"{dist_info}/licenses/LICENSE") == (REPO_ROOT / "LICENSE").read_bytes()
    metadata = metadata_of(wheel)
    assert metadata["Version"] == package.version
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["License-File"] == "LICENSE"
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL", []))
    assert tuple(urls) == URL_LABELS, urls
    assert metadata["Description-Content-Type"] == "text/markdown"
    description = str(metadata.get_payload())
    assert description == (tree / directory / "README.md").read_text(), description
    assert "Owner:" in description, description


def test_protos_wheel_holds_the_generated_code(tree: Path, wheels: dict[str, Path]) -> None:
    files = files_of(wheels[PROTOS])
    expected = generated_files(tree)
    assert len(expected) > 10, expected
    missing = sorted(set(expected) - set(files))
    assert not missing, f"the protos wheel lacks {missing}"
    modules = [f for f in files if not f.startswith("nexuscrm_protos-")]
    assert sorted(modules) == expected, sorted(set(modules) ^ set(expected))


def test_protos_requirements_are_what_the_generated_code_checks(wheels: dict[str, Path]) -> None:
    archive = zipfile.ZipFile(wheels[PROTOS])
    grpc_versions = set()
    protobuf_versions = set()
    for name in archive.namelist():
        text = archive.read(name).decode() if name.endswith(".py") else ""
        if name.endswith("_pb2_grpc.py"):
            grpc_versions |= set(GRPC_GENERATED.findall(text))
        elif name.endswith("_pb2.py"):
            protobuf_versions |= {".".join(found) for found in PROTOBUF_GENCODE.findall(text)}
    assert len(grpc_versions) == 1 and len(protobuf_versions) == 1, (grpc_versions, protobuf_versions)
    requires = {Requirement(r).name: Requirement(r) for r in metadata_of(wheels[PROTOS]).get_all("Requires-Dist", [])}
    for name, generated in (("grpcio", grpc_versions.pop()), ("protobuf", protobuf_versions.pop())):
        floor = Version(generated)
        expected = {f">={floor}", f"<{floor.major + 1}"}
        assert {str(s) for s in requires[name].specifier} == expected, (name, requires[name])
        print(f"{name}: generated for {floor}, declared {requires[name].specifier}")


def test_protos_sdist_carries_the_contract_and_builds_the_same_wheel(
    tree: Path, wheels: dict[str, Path], tmp_path: Path
) -> None:
    source = tmp_path / "protos"
    shutil.copytree(tree / "protos", source, symlinks=False)  # the LICENSE link resolved: a file
    sdists = tmp_path / "sdist"
    sdists.mkdir()
    subprocess.run(
        [sys.executable, "-c", SDIST_HOOK, str(sdists)],
        cwd=source / "python",
        capture_output=True,
        check=True,
        timeout=120,
    )
    (sdist,) = sdists.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        members = {m.name.split("/", 1)[1]: m for m in archive.getmembers() if "/" in m.name}
    protos = [p.relative_to(tree / "protos").as_posix() for p in (tree / "protos").glob("nexuscrm/**/*.proto")]
    for path in ["LICENSE", "README.md", "pyproject.toml", "setup.py", "contract/generate.py"]:
        assert path in members and members[path].isfile(), sorted(members)
    assert {f"contract/{p}" for p in protos} <= set(members), sorted(members)
    assert not [m for m in members if m.startswith("nexuscrm/")], "the sdist carries generated code"
    out = tmp_path / "from-sdist"
    result = pip_wheel([sdist], out)
    assert result.returncode == 0, result.stderr
    (wheel,) = out.glob("*.whl")
    assert files_of(wheel) == files_of(wheels[PROTOS])


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("a .proto file that does not parse", "protoc failed with status 1 on "),
        ("no .proto file", "no .proto file found below "),
    ],
)
def test_protos_build_that_cannot_generate_fails_naming_why(
    fault: str, message: str, tree: Path, tmp_path: Path
) -> None:
    shutil.copytree(tree / "protos", tmp_path / "protos", symlinks=True)
    shutil.copy2(tree / "LICENSE", tmp_path / "LICENSE")
    protos = sorted((tmp_path / "protos").glob("nexuscrm/**/*.proto"))
    if fault == "no .proto file":
        for proto in protos:
            proto.unlink()
    else:
        protos[0].write_text(protos[0].read_text() + "\nmessage Unclosed {\n")
    out = tmp_path / "dist"
    result = pip_wheel([tmp_path / "protos" / "python"], out)
    assert result.returncode != 0
    assert f"{REFUSAL}: {message}" in result.stdout + result.stderr, result.stdout + result.stderr
    assert not out.exists() or not list(out.glob("*.whl"))
