"""The PySpark data source ``tidelog``: batch and streaming reads and writes of topics.

::

    from tidelog.spark_sink import TidelogDataSource
    spark.dataSource.register(TidelogDataSource)   # or nothing: pyspark_tidelog does it
    df = spark.readStream.format("tidelog").option("subscribe", "events").load()

The only package that imports pyspark; it reaches the broker through ``client`` only.
Modules: ``options`` (frozen option dataclasses), ``offsets`` (pure offset JSON, admission
control, range splitting), ``schema`` (columns and Arrow conversion), ``broker_view``
(driver lookups), ``reader`` (executor reads), ``writer`` (effectively-once writes),
``source`` (the Spark classes). ``docs/spark.md`` documents options and design.
"""

from tidelog.spark_sink.options import ReadOptions, WriteOptions
from tidelog.spark_sink.reader import DataLossError
from tidelog.spark_sink.source import TidelogDataSource

__all__ = ["DataLossError", "ReadOptions", "TidelogDataSource", "WriteOptions"]
