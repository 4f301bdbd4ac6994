"""``format("tidelog")`` with no registration, from a directory outside the checkout.

PySpark registers a ``pyspark_<name>`` module it finds with ``pkgutil.iter_modules()``. A
setuptools editable install in its default mode is an import hook that function does not
see, so the README's install found the source only when the job ran from the project root
(issue 11), and a plain ``pip install -e .`` never (issue 25). ``pyproject.toml`` declares
the flat layout simple (``package-dir``), so every editable mode writes a path entry; this
runs a real Spark job in a subprocess whose working directory is a temporary folder, with
no ``PYTHONPATH``, as a user's job would run, and checks each mode's install as PySpark's
lookup sees it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.spark.conftest import TopicFactory, produce
from tidelog.broker.testing import InProcessBroker

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
    # One name in site-packages (issue #26): the layers are real folders under tidelog/,
    # none of the generic names (client, storage, ...) at the top.
    source = target / "tidelog" / "spark_sink" / "source.py"
    assert source.is_file()
    assert not source.parent.is_symlink()
    top = {p.name for p in target.iterdir()}
    assert not top & {"broker", "client", "storage", "proto", "spark_sink"}, top
    code = (
        "import tidelog; from tidelog import Producer, TopicPartition; "
        "print(tidelog.__file__, Producer.__module__, TopicPartition.__module__)"
    )
    short = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert short.stdout.split() == [
        str(target / "tidelog" / "__init__.py"),
        "tidelog.client.producer",
        "tidelog.storage.types",
    ]


# What PySpark's data-source lookup (pyspark.sql.worker.lookup_data_sources) does, run with
# the test venv's packages on the path but none of its .pth files (its own editable install
# of this checkout would hide the one under test), and the install under test as a site
# directory, as a venv's site-packages is.
_LOOKUP = """
import importlib, pkgutil, site, sys
sys.path.append(sys.argv[1])
site.addsitedir(sys.argv[2])
names = [m.name for m in pkgutil.iter_modules() if m.name.startswith("pyspark_")]
print("FOUND", names)
module = importlib.import_module("pyspark_tidelog")
print("NAME", module.DefaultSource.name(), "FILE", module.__file__)
"""


# setuptools' PEP 660 hook, as pip calls it for `pip install -e`; pip itself is not run,
# because it would first uninstall the test venv's own install of the same distribution.
_BUILD_EDITABLE = """
import sys
from setuptools import build_meta
settings = {"editable_mode": sys.argv[2]} if sys.argv[2] else None
print(build_meta.build_editable(sys.argv[1], settings))
"""


@pytest.mark.parametrize("mode", ["", "compat", "strict"])
def test_every_editable_install_mode_lets_spark_find_the_source(tmp_path: Path, mode: str) -> None:
    """``pip install -e .`` (setuptools' default mode, an import hook unless the layout is
    declared simple), ``compat`` and ``strict``: PySpark must find
    ``pyspark_tidelog`` with ``pkgutil.iter_modules()`` in each. Built from a copy of the
    tree, so the checkout's extension is never rewritten under a running test, and
    unpacked into a site directory of its own, as pip installs an editable wheel."""
    root = Path(__file__).resolve().parents[2]
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "pyspark_tidelog.py"):
        shutil.copy2(root / name, project / name)
    for package in ("storage", "broker", "client", "spark_sink", "proto"):
        shutil.copytree(
            root / package,
            project / package,
            ignore=shutil.ignore_patterns("*.so", "__pycache__"),
        )
    # The installed name: links to the five folders (tidelog/__init__.py).
    shutil.copytree(
        root / "tidelog", project / "tidelog", symlinks=True, ignore=shutil.ignore_patterns("*.pyc")
    )
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    built = subprocess.run(
        [sys.executable, "-c", _BUILD_EDITABLE, str(wheels), mode],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    site_dir = tmp_path / "site"
    with zipfile.ZipFile(wheels / built.stdout.strip().splitlines()[-1]) as wheel:
        wheel.extractall(site_dir)
    found = subprocess.run(
        [sys.executable, "-S", "-c", _LOOKUP, sysconfig.get_paths()["purelib"], str(site_dir)],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert found.returncode == 0, found.stderr[-3000:]
    assert "FOUND ['pyspark_tidelog']" in found.stdout, found.stdout
    assert "NAME tidelog" in found.stdout
    assert str(tmp_path) in found.stdout.split("FILE", 1)[1]
