"""Shared plumbing of the Spark examples: arguments, the session, topics.

Not an example itself. Each example runs with one command against a broker (``tidelog
serve`` or ``docker-compose up broker``); see the docstring at the top of each file.
The repository root goes on ``sys.path`` and ``PYTHONPATH`` so that Spark's Python
workers import ``pyspark_tidelog`` (which registers ``format("tidelog")``) without an
install, and ``PYSPARK_PYTHON`` is this interpreter, as PySpark data sources need.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tidelog import AdminClient, TopicAlreadyExistsError  # noqa: E402


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--bootstrap",
        default=os.environ.get("TIDELOG_BOOTSTRAP", "127.0.0.1:7410"),
        help="broker HOST:PORT (default $TIDELOG_BOOTSTRAP or 127.0.0.1:7410)",
    )
    p.add_argument("--checkpoint-dir", default=os.environ.get("CHECKPOINT_DIR", "checkpoints"))
    p.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[2]"))
    p.add_argument(
        "--run-seconds", type=float, default=None, help="stop after this long (default: never)"
    )
    return p


def spark_session(master: str, app: str) -> Any:
    """The session (``getOrCreate``: a test's session is reused)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    path = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), path) if p)
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )


def ensure_topics(
    bootstrap: str, topics: Sequence[str], partitions: int = 2, **config: str
) -> None:
    """Create the topics that do not exist yet."""
    with AdminClient(bootstrap) as admin:
        for topic in topics:
            try:
                admin.create_topic(topic, partitions, config or None)
            except TopicAlreadyExistsError:
                pass


def run(queries: Sequence[Any], run_seconds: float | None) -> None:
    """Wait for the queries (forever, or ``run_seconds``), then stop them."""
    try:
        if run_seconds is None:
            queries[0].sparkSession.streams.awaitAnyTermination()
        else:
            queries[0].sparkSession.streams.awaitAnyTermination(run_seconds)
    finally:
        for query in queries:
            query.stop()
