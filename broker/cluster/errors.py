"""Errors of the cluster's ZooKeeper layer (importable without kazoo, e.g. by the CLI)."""

from __future__ import annotations

__all__ = ["ControllerMovedError", "StaleStateError", "StoreError"]


class StoreError(Exception):
    """ZooKeeper could not be reached or refused an operation."""


class ControllerMovedError(StoreError):
    """This broker's controller epoch is no longer the current one: it is not controller."""


class StaleStateError(StoreError):
    """A compare-and-set found another version: re-read and decide again."""
