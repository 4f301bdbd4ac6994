"""The PySpark data source ``tidelog`` (batch and streaming reads and writes).

Not built yet: the open issue "PySpark data source `tidelog`" tracks it. The package exists
so the layout, packaging and dependency-direction checks cover it from the start; it is
the only package that will import pyspark, and it may import only ``client``.
"""

__all__: list[str] = []
