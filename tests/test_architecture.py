"""Project-wide rules: dependency direction between packages and guarded public surfaces.

The direction (STYLE.md): ``storage`` <- ``broker``; ``storage.records`` <- ``client`` <-
``spark_sink``; ``proto`` <- ``broker``, ``client``. Checked on the source with ``ast`` so a
stray import fails here rather than in review.
"""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("storage", "broker", "client", "spark_sink", "proto")

# package -> (top-level names it must never import, storage modules it may import or None=any)
FORBIDDEN: dict[str, set[str]] = {
    "storage": {"broker", "client", "spark_sink", "proto", "grpc", "pyspark", "google"},
    "broker": {"client", "spark_sink", "pyspark"},
    "client": {"broker", "spark_sink", "pyspark"},
    "spark_sink": {"broker"},
    "proto": {"storage", "broker", "client", "spark_sink", "pyspark"},
}
# The client sees only the wire format (records, its columnar decoding, the codec choice)
# and the shared error tree of storage.
CLIENT_STORAGE_ALLOWED = {
    "storage.records",
    "storage.errors",
    "storage.varint",
    "storage.columns",
    "storage.native",
    # The fetch answer's batch times: a wire format storage defines next to the sidecar
    # it is read from, as records.py defines the batches (pure, no file or lock used).
    "storage.batch_times",
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _sources(package: str) -> list[Path]:
    return [
        p
        for p in (ROOT / package).rglob("*.py")
        if "_pb2" not in p.name  # generated code imports what protoc says
    ]


@pytest.mark.parametrize("package", PACKAGES)
def test_dependency_direction(package: str) -> None:
    violations = []
    for path in _sources(package):
        for name in _imports(path):
            top = name.split(".")[0]
            if top in FORBIDDEN[package]:
                violations.append(f"{path.relative_to(ROOT)} imports {name}")
            storage_reach = top == "storage" and package in ("client", "spark_sink")
            if storage_reach and (package == "spark_sink" or name not in CLIENT_STORAGE_ALLOWED):
                violations.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not violations, "\n".join(violations)


# Top-level modules outside the packages -> the top-level names they may import.
# ``pyspark_tidelog`` is PySpark's entry point (a ``pyspark_<name>`` module is registered
# by itself); it only re-exports ``spark_sink``.
TOP_LEVEL_MODULES: dict[str, set[str]] = {"pyspark_tidelog.py": {"__future__", "spark_sink"}}


@pytest.mark.parametrize("module", sorted(TOP_LEVEL_MODULES))
def test_top_level_modules_import_only_what_they_front(module: str) -> None:
    tops = {name.split(".")[0] for name in _imports(ROOT / module)}
    assert tops <= TOP_LEVEL_MODULES[module], f"{module} imports {tops}"


def test_the_broker_has_one_grpc_serving_model() -> None:
    """Issue #26 retired the threaded model (a synchronous ``grpc.server``): a second
    serving model would need every rule of the request pipeline written twice. The broker
    serves gRPC through ``grpc.aio`` only (``broker.grpc_async``)."""
    offenders = []
    for path in _sources("broker"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "server"
                and isinstance(node.value, ast.Name)
                and node.value.id == "grpc"
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"synchronous grpc.server in the broker: {offenders}"


def test_packages_exist_with_sources() -> None:
    for package in PACKAGES:
        assert (ROOT / package / "__init__.py").is_file(), package
        assert _sources(package), f"{package} has no Python sources"


def _public_modules(package: str) -> list[str]:
    modules = []
    for path in _sources(package):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts
        if any(p.startswith("_") and p != "__init__" for p in parts) or parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules.append(".".join(parts))
    return sorted(modules)


@pytest.mark.parametrize(
    "module_name", [m for p in ("storage", "broker") for m in _public_modules(p)]
)
def test_public_modules_declare_all(module_name: str) -> None:
    """Every public module says what it exports, and every exported name exists."""
    module = importlib.import_module(module_name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{module_name} has no __all__"
    assert len(exported) == len(set(exported)), f"{module_name}.__all__ has duplicates"
    missing = [name for name in exported if not hasattr(module, name)]
    assert not missing, f"{module_name}.__all__ names missing attributes: {missing}"


def test_storage_package_surface() -> None:
    import storage

    assert set(storage.__all__) == {
        "AppendResult",
        "Clock",
        "LogConfig",
        "LogManager",
        "LogManagerConfig",
        "ManualClock",
        "PartitionLog",
        "ReadResult",
        "SystemClock",
        "TopicMetadata",
    }
    assert all(hasattr(storage, name) for name in storage.__all__)
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _ = storage.Nothing  # type: ignore[attr-defined]


def test_importing_the_client_leaves_the_storage_engine_unloaded() -> None:
    # In a fresh interpreter: this test process has long loaded everything.
    code = (
        "import sys, client; "
        "print(sorted(m for m in sys.modules if m.startswith(('storage', 'broker'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    loaded = set(ast.literal_eval(out.strip()))
    assert loaded <= {
        "storage",
        "storage.errors",
        "storage.records",
        "storage.varint",
        "storage.batch_builder",
        "storage.compression",
        "storage.columns",
        "storage.batch_times",
        "storage.native",
        "storage._native",
    }, loaded
