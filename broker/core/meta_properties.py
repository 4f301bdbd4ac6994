"""``meta.properties``: which broker and which cluster a data directory belongs to.

Kafka's file of the same name, in Java properties syntax::

    version=0
    broker.id=2
    cluster.id=8d4c0a3e-...

Written atomically (``storage.files.atomic_write``) the first time a broker opens the
directory. Afterwards a broker started on it with another ``broker.id``, or (cluster mode)
joining a ZooKeeper whose cluster id differs, refuses to start: the directory's data
belongs elsewhere, and serving it would mix two logs' offsets.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from tidelog.storage.errors import InvalidConfigError
from tidelog.storage.files import atomic_write

__all__ = ["META_PROPERTIES", "ensure_meta_properties"]

META_PROPERTIES = "meta.properties"


def _parse(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, _, value = line.partition("=")
        out[key.strip()] = value.strip()
    return out


def ensure_meta_properties(data_dir: Path, broker_id: int, cluster_id: str | None = None) -> str:
    """The directory's cluster id, creating the file if needed; returns the cluster id.

    ``cluster_id`` is the cluster's (cluster mode) or None (single node: a new id is made
    for a new directory).

    Raises:
        InvalidConfigError: the directory belongs to another broker id or cluster.
    """
    path = data_dir / META_PROPERTIES
    if path.exists():
        found = _parse(path.read_text())
        stored_broker = found.get("broker.id")
        if stored_broker is not None and stored_broker != str(broker_id):
            raise InvalidConfigError(
                f"broker.id: {data_dir} belongs to broker {stored_broker}, not {broker_id} "
                f"(see {path})"
            )
        stored_cluster = found.get("cluster.id")
        if stored_cluster and cluster_id is not None and stored_cluster != cluster_id:
            raise InvalidConfigError(
                f"zookeeper.connect: {data_dir} belongs to cluster {stored_cluster}, but "
                f"ZooKeeper holds cluster {cluster_id} (see {path})"
            )
        if stored_cluster:
            return stored_cluster
    chosen = cluster_id or str(uuid.uuid4())
    atomic_write(path, f"version=0\nbroker.id={broker_id}\ncluster.id={chosen}\n".encode())
    return chosen
