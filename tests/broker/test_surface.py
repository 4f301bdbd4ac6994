"""Every broker module says what it exports, and the exported names exist."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from tidelog import broker

MODULES = sorted(
    f"tidelog.broker.{m.name}"
    for m in pkgutil.iter_modules(broker.__path__)
    if m.name != "__main__"
)


@pytest.mark.parametrize("name", MODULES)
def test_module_declares_all(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    assert len(set(exported)) == len(exported)
    assert [n for n in exported if not hasattr(module, n)] == []
    assert module.__doc__, f"{name} has no module docstring"


def test_the_public_harness_and_entry_points() -> None:
    from tidelog.broker.cli import main
    from tidelog.broker.testing import InProcessBroker

    assert callable(main)
    assert InProcessBroker.__doc__
    assert broker.__all__ == []
