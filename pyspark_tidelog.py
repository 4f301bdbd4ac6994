"""PySpark's entry point to the ``tidelog`` data source: ``format("tidelog")`` needs nothing else.

PySpark looks for top-level modules named ``pyspark_<name>`` with a ``DefaultSource`` class
and registers it under ``DefaultSource.name()`` ("tidelog") when a session first resolves a
data source, so with this module importable (installed, or on ``PYTHONPATH`` for the driver
and the executors) ``spark.read.format("tidelog")`` works with no registration at all. The
explicit form, for a module that is not importable by that name, is one line::

    from tidelog.spark_sink import TidelogDataSource
    spark.dataSource.register(TidelogDataSource)

The implementation is the ``spark_sink`` package (``docs/spark.md``).
"""

from __future__ import annotations

from tidelog.spark_sink.source import TidelogDataSource

__all__ = ["DefaultSource", "TidelogDataSource"]

DefaultSource = TidelogDataSource
