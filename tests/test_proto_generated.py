"""The committed generated code is exactly what ``broker.proto`` produces."""

from __future__ import annotations

import shutil
from pathlib import Path

from tidelog.proto import generate


def test_generated_code_matches_proto() -> None:
    assert generate.check() == [], "run: python -m tidelog.proto.generate"


def test_check_notices_a_stale_file(tmp_path: Path) -> None:
    for rel in generate.GENERATED_FILES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(generate.REPO_ROOT / rel, tmp_path / rel)
    assert generate.check(tmp_path) == []
    stale = generate.GENERATED_FILES[0]
    (tmp_path / stale).write_bytes((tmp_path / stale).read_bytes() + b"# edited by hand\n")
    (tmp_path / generate.GENERATED_FILES[2]).unlink()
    assert generate.check(tmp_path) == [stale, generate.GENERATED_FILES[2]]


def test_generated_imports_are_package_relative() -> None:
    grpc_module = (generate.REPO_ROOT / "tidelog/proto/tidelog/v1/broker_pb2_grpc.py").read_text()
    assert "from tidelog.proto.tidelog.v1 import broker_pb2" in grpc_module
