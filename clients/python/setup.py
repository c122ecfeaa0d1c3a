"""Build hook: compiles the router's protos into tandem_client._proto.

The stubs are generated at build time from the repository's
proto/tandem/v1/generate.proto and written into the build tree only (never
into the sources). The metadata is in pyproject.toml.

Compilers, in order:
  1. protoc with the gRPC Python plugin (Debian: protobuf-compiler and
     protobuf-compiler-grpc; $PROTOC and $GRPC_PYTHON_PLUGIN override the
     programs found on PATH);
  2. the grpc_tools module (pip's grpcio-tools). Debian 12's
     python3-grpc-tools (1.14) is too old for proto3 `optional` and refuses
     the protos, hence the order.
The proto folder is $TANDEM_PROTO_DIR, else ../../proto beside this file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PROTO = "tandem/v1/generate.proto"


def proto_dir() -> Path:
    candidates = []
    if os.environ.get("TANDEM_PROTO_DIR"):
        candidates.append(Path(os.environ["TANDEM_PROTO_DIR"]))
    candidates.append(HERE.parent.parent / "proto")
    for c in candidates:
        if (c / PROTO).is_file():
            return c
    raise SystemExit(
        f"tandem-client: {PROTO} not found under {' or '.join(map(str, candidates))}; "
        "install from a checkout of the repository or set TANDEM_PROTO_DIR"
    )


def compiler_command(out: Path) -> list[str]:
    """The protoc command line, without the input file."""
    protoc = os.environ.get("PROTOC") or shutil.which("protoc")
    plugin = os.environ.get("GRPC_PYTHON_PLUGIN") or shutil.which("grpc_python_plugin")
    if protoc and plugin:
        return [protoc, f"--plugin=protoc-gen-grpc_python={plugin}",
                f"--python_out={out}", f"--grpc_python_out={out}"]
    try:
        import grpc_tools.protoc  # noqa: F401
    except ImportError:
        raise SystemExit(
            "tandem-client: no proto compiler: install protoc and grpc_python_plugin "
            "(Debian: apt-get install protobuf-compiler protobuf-compiler-grpc)"
        ) from None
    return [sys.executable, "-m", "grpc_tools.protoc",
            f"--python_out={out}", f"--grpc_python_out={out}"]


def generate(target: Path) -> None:
    protos = proto_dir()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        cmd = compiler_command(out) + [f"-I{protos}", str(protos / PROTO)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(
                f"tandem-client: {' '.join(cmd)} failed:\n{done.stderr}"
                "(Debian's python3-grpc-tools 1.14 cannot compile these protos: "
                "install protobuf-compiler and protobuf-compiler-grpc)"
            )
        generated = out / "tandem" / "v1"
        messages = (generated / "generate_pb2.py").read_text()
        service = (generated / "generate_pb2_grpc.py").read_text()
    # The service stub imports the messages by their proto package; inside
    # tandem_client the import is relative.
    service, n = re.subn(r"^from tandem\.v1 import (generate_pb2 as \w+)$",
                         r"from . import \1", service, flags=re.M)
    if n != 1:
        raise SystemExit("tandem-client: unexpected import lines in generate_pb2_grpc.py")
    target.mkdir(parents=True, exist_ok=True)
    (target / "__init__.py").write_text('"""Stubs generated from proto/tandem/v1 at build time."""\n')
    (target / "generate_pb2.py").write_text(messages)
    (target / "generate_pb2_grpc.py").write_text(service)


class BuildPyWithStubs(build_py):
    """build_py, then the generated stubs beside the package's modules."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "tandem_client" / "_proto"
        generate(target)
        print(f"tandem-client: generated stubs in {target}")


setup(cmdclass={"build_py": BuildPyWithStubs})
