"""Generate (or check) the committed Python code for ``proto/tidelog/v1/broker.proto``.

``python -m tidelog.proto.generate`` rewrites the four generated modules next to the ``.proto``:
``broker_pb2.py`` (messages), ``broker_pb2_grpc.py`` (stub and servicer), and their
``.pyi`` type stubs from mypy-protobuf. ``python -m tidelog.proto.generate --check`` generates into
a temporary directory and exits with status 1, naming the files, when anything differs
from what is committed.

protoc runs from the repository root with ``-I .`` on the path through ``tidelog/proto`` (the
link to ``proto/``) so that the generated imports read ``from tidelog.proto.tidelog.v1 import
broker_pb2``, the installed name. The output depends on the versions of
grpcio-tools (protoc and the grpc plugin) and mypy-protobuf, so those are pinned in the
project's development dependencies.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["GENERATED_FILES", "PROTO_FILE", "REPO_ROOT", "check", "generate", "main"]

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_FILE = Path("tidelog/proto/tidelog/v1/broker.proto")
GENERATED_FILES = (
    Path("tidelog/proto/tidelog/v1/broker_pb2.py"),
    Path("tidelog/proto/tidelog/v1/broker_pb2.pyi"),
    Path("tidelog/proto/tidelog/v1/broker_pb2_grpc.py"),
    Path("tidelog/proto/tidelog/v1/broker_pb2_grpc.pyi"),
)


def _plugin(name: str) -> str:
    """Path of a protoc plugin installed next to this interpreter (or on PATH)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: install mypy-protobuf")
    return found


def generate(out_dir: Path) -> None:
    """Run protoc on ``PROTO_FILE`` writing the generated files under ``out_dir``.

    ``out_dir`` plays the part of the repository root: files land at
    ``out_dir / GENERATED_FILES[i]``.

    Raises:
        RuntimeError: protoc or a plugin failed or is missing.
    """
    from grpc_tools import protoc  # type: ignore[import-untyped]  # dev dependency, untyped

    # protoc's bundled well-known types (google/protobuf/*.proto), as grpc_tools' own
    # command line adds them.
    well_known = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        "-I.",
        f"-I{well_known}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out=quiet:{out_dir}",
        f"--mypy_grpc_out=quiet:{out_dir}",
        str(PROTO_FILE),
    ]
    cwd = Path.cwd()
    os.chdir(REPO_ROOT)  # -I . must be the repository root for the import paths
    try:
        status = protoc.main(args)
    finally:
        os.chdir(cwd)
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status}")


def check(committed_root: Path = REPO_ROOT) -> list[Path]:
    """Regenerate into a temporary directory; return the files under ``committed_root``
    (the repository root unless a test points elsewhere) that differ or are missing."""
    with tempfile.TemporaryDirectory(prefix="tidelog-proto-") as tmp:
        out = Path(tmp)
        generate(out)
        differ: list[Path] = []
        for rel in GENERATED_FILES:
            fresh = (out / rel).read_bytes()
            committed = committed_root / rel
            if not committed.exists() or committed.read_bytes() != fresh:
                differ.append(rel)
        return differ


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: generate, or with ``--check`` compare; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tidelog.proto.generate", description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the committed files are stale"
    )
    args = parser.parse_args(argv)
    if args.check:
        differ = check()
        for rel in differ:
            sys.stderr.write(
                f"stale generated file: {rel} (run python -m tidelog.proto.generate)\n"
            )
        return 1 if differ else 0
    generate(REPO_ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
