"""The console uses the public client API only (issue 19: it must work against any
Tidelog cluster), so it never reaches into the broker, the wire types or the client's
transport internals."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONSOLE = ROOT / "client" / "console"
# The public client surface (DESIGN.md, "The Python API"), the shared errors, the console
# itself, and its web stack.
ALLOWED_PROJECT = {
    "client",
    "tidelog.client.admin",
    "tidelog.client.acls",
    "tidelog.client.consumer",
    "tidelog.client.producer",
    "tidelog.client.types",
    "tidelog.storage.errors",
}
ALLOWED_THIRD_PARTY = {"starlette", "jinja2", "uvicorn"}
PROJECT_TOPS = {"client", "storage", "broker", "proto", "spark_sink", "grpc", "google"}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_console_imports_only_the_public_client_api() -> None:
    sources = sorted(CONSOLE.rglob("*.py"))
    assert sources
    violations = []
    for path in sources:
        for name in _imports(path):
            top = name.split(".")[0]
            if name.startswith("tidelog.client.console"):
                continue
            if top in PROJECT_TOPS and name not in ALLOWED_PROJECT:
                violations.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not violations, "\n".join(violations)


def test_the_web_stack_is_only_the_console_extra() -> None:
    third_party = set()
    for path in CONSOLE.rglob("*.py"):
        for name in _imports(path):
            top = name.split(".")[0]
            if top in {"starlette", "jinja2", "uvicorn", "aiohttp", "flask", "fastapi"}:
                third_party.add(top)
    assert third_party == ALLOWED_THIRD_PARTY
    # Nothing else in the client imports the web stack: the library stays free of it.
    for path in (ROOT / "client").rglob("*.py"):
        if CONSOLE in path.parents:
            continue
        tops = {name.split(".")[0] for name in _imports(path)}
        assert not tops & ALLOWED_THIRD_PARTY, path
