"""``format("tidelog")`` with no registration, from a directory outside the checkout.

PySpark registers a ``pyspark_<name>`` module it finds with ``pkgutil.iter_modules()``. A
setuptools editable install in its default mode is an import hook that function does not
see, so the README's install found the source only when the job ran from the project root
(issue 11). ``make`` installs in ``compat`` mode (a path entry); this runs a real Spark job
in a subprocess whose working directory is a temporary folder, with no ``PYTHONPATH``, as a
user's job would run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.testing import InProcessBroker
from tests.spark.conftest import TopicFactory, produce

pytestmark = [pytest.mark.spark, pytest.mark.slow]

_JOB = """
import sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "1").getOrCreate())
rows = (spark.read.format("tidelog").option("bootstrap.servers", sys.argv[1])
        .option("subscribe", sys.argv[2]).load().collect())
print("VALUES", sorted(bytes(r.value).decode() for r in rows))
spark.stop()
"""


def test_format_tidelog_is_found_from_any_directory(
    broker: InProcessBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = new_topic()
    produce(broker.address, topic, [b"a", b"b"])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    (tmp_path / "job.py").write_text(_JOB)
    result = subprocess.run(
        [sys.executable, "job.py", broker.address, topic],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "VALUES ['a', 'b']" in result.stdout


def test_a_regular_install_puts_the_entry_module_where_pkgutil_finds_it(tmp_path: Path) -> None:
    """``pip install .`` (a wheel): ``pyspark_tidelog`` sits at the top of site-packages."""
    root = Path(__file__).resolve().parents[2]
    target = tmp_path / "site"
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"),
            *("--no-build-isolation", "--target", str(target), str(root)),
        ],
        check=True,
        capture_output=True,
        timeout=110,
    )
    found = subprocess.run(
        [sys.executable, "-c", "import pkgutil; print([m.name for m in pkgutil.iter_modules()])"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "'pyspark_tidelog'" in found.stdout
    assert (target / "spark_sink" / "source.py").is_file()
