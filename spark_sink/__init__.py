"""The PySpark data source ``tidelog``: batch and streaming reads and writes of topics.

::

    from spark_sink import TidelogDataSource
    spark.dataSource.register(TidelogDataSource)   # or nothing: pyspark_tidelog does it
    df = spark.readStream.format("tidelog").option("subscribe", "events").load()

The only package that imports pyspark; it reaches the broker through ``client`` only.
Modules: ``options`` (frozen option dataclasses), ``offsets`` (pure offset JSON, admission
control, range splitting), ``schema`` (columns and Arrow conversion), ``broker_view``
(driver lookups), ``reader`` (executor reads), ``writer`` (effectively-once writes),
``source`` (the Spark classes). ``docs/spark.md`` documents options and design.
"""

from spark_sink.options import ReadOptions, WriteOptions
from spark_sink.reader import DataLossError
from spark_sink.source import TidelogDataSource

__all__ = ["DataLossError", "ReadOptions", "TidelogDataSource", "WriteOptions"]
