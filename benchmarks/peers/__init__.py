"""The peers of the comparison (``benchmarks/run.py``): one module per system.

Each peer module has the same surface, so the harness treats them alike:

- ``NAME`` (command-line name), ``LABEL`` (for tables), ``BINARIES`` (binary -> Debian
  package the harness may install), ``CONFIGURATION`` (how it is set up, for the report);
- ``version()``: the server's version string;
- ``start(work_dir)`` -> a ``common.RunningServer`` with ``address`` and ``data_dir``,
  and ``stop()`` (the whole process group);
- ``run(workload, address)``: one measurement, run inside a worker process
  (``benchmarks.peers.worker``) so no client state, thread or garbage survives between two.
"""

from __future__ import annotations

from types import ModuleType

from benchmarks.peers import nats_peer, redis_peer, tidelog_kafka_peer, tidelog_peer

PEERS: dict[str, ModuleType] = {
    module.NAME: module for module in (tidelog_peer, tidelog_kafka_peer, nats_peer, redis_peer)
}

__all__ = ["PEERS"]
