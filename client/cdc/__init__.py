"""Change data capture from PostgreSQL into Tidelog topics (issue #30; docs/cdc.md).

::

    from tidelog.client.cdc import ConnectorConfig, PostgresConnector

    PostgresConnector(ConnectorConfig(dsn="dbname=shop", bootstrap_servers="127.0.0.1:7410",
                                      tables=("public.orders",))).run()

Client-side, in layers: ``pgoutput`` decodes PostgreSQL's logical replication messages
(pure), ``events`` turns them and snapshot rows into Debezium-style records grouped in
one unit per transaction (pure), ``sink`` stores units (the ``ChangeSink`` seam and the
at-least-once ``ProducerSink``), ``txn_sink`` the exactly-once ``TransactionalSink`` (the
default), ``testhooks`` a documented stop point for kill tests, ``catalog`` asks
PostgreSQL's catalog, ``connector`` runs the snapshot-then-stream handoff. Needs the
``cdc`` extra (psycopg2); importing ``tidelog.client`` never imports this package.
"""

from __future__ import annotations

from tidelog.client.cdc.connector import ConnectorConfig, Lag, PostgresConnector
from tidelog.client.cdc.events import CdcError, ChangeRecord, ChangeUnit, Position
from tidelog.client.cdc.sink import ChangeSink, ProducerSink
from tidelog.client.cdc.txn_sink import TransactionalSink

__all__ = [
    "CdcError",
    "ChangeRecord",
    "ChangeSink",
    "ChangeUnit",
    "ConnectorConfig",
    "Lag",
    "Position",
    "PostgresConnector",
    "ProducerSink",
    "TransactionalSink",
]
