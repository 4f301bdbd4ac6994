"""kafka-python's own integration suite against the Kafka listener: ``make
kafka-python-suite`` (``python -m tests.kafka.client_suite [--keep DIR] [-- PYTEST ARGS]``).

Not a test of this repository (pytest does not collect it) and not run by CI: the suite is
another project's, fetched at run time, and its verdicts are read, not asserted
(``docs/kafka.md``, "kafka-python's integration suite", lists what fails and why).

What it does: downloads the sdist of the installed kafka-python version with pip (the
sdist ships ``test/``; the confluent-kafka and aiokafka sdists ship no tests, and
librdkafka's are in Debian's source package only), adds the two files that sdist lacks
(``test/__init__.py``, so ``test`` is not the standard library's package, and a
``test/service.py`` with the external-broker class the fixtures import), starts a broker
with the Kafka listener on a free port (as ``tests/kafka/conftest.py`` does, plus
``auto.create.topics.enable`` and ``num.partitions`` 4, the suite's Kafka settings) and
runs ``test/integration`` with ``KAFKA_URI`` pointing at it (``KafkaFixture(external=
True)``) and ``KAFKA_VERSION`` 4.2.0. The SASL and SSL tests start brokers of their own
and are deselected. Exits with pytest's code.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tidelog.broker.testing import InProcessBroker

KAFKA_VERSION = "4.2.0"  # what the suite's version gates compare with

_SERVICE = '''\
"""Stand-in for kafka-python's test/service.py (its sdist lacks it): the external
broker only (KAFKA_URI)."""


class ExternalService:
    def __init__(self, host, port):
        self.host = host
        self.port = port

    def open(self):
        pass

    def close(self):
        pass

    def dump_logs(self):
        pass


class SpawnedService:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("no Kafka is spawned here: KAFKA_URI names the broker")
'''


def unpack_suite(directory: Path) -> Path:
    """The installed kafka-python's sdist, unpacked in ``directory``, with the two
    missing files added; its root."""
    version = importlib.metadata.version("kafka-python")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"kafka-python=={version}",
            "-d",
            str(directory),
        ],
        check=True,
    )
    (archive,) = directory.glob("kafka_python-*.tar.gz")
    with tarfile.open(archive) as sdist:
        sdist.extractall(directory, filter="data")
    root = directory / f"kafka_python-{version}"
    (root / "test" / "__init__.py").touch()
    (root / "test" / "service.py").write_text(_SERVICE)
    (directory / "kafka-root").mkdir(exist_ok=True)  # the fixtures insist it exists
    return root


def run(root: Path, bootstrap: str, pytest_args: list[str]) -> int:
    """pytest's exit code for the suite at ``root`` against ``bootstrap``."""
    env = {
        **os.environ,
        "KAFKA_VERSION": KAFKA_VERSION,
        "KAFKA_URI": f"tcp://{bootstrap}",
        "KAFKA_ROOT": str(root.parent / "kafka-root"),
    }
    command = [
        sys.executable,
        "-m",
        "pytest",
        "test/integration",
        "-k",
        "not sasl and not ssl",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfEs",
        "-o",
        "log_level=WARNING",
        "-W",
        "ignore",
        "--timeout=60",
        *pytest_args,
    ]
    return subprocess.run(command, cwd=root, env=env, check=False).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="unpack the suite here and keep it")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args()
    settings = {
        "kafka.listen": "127.0.0.1:0",
        "auto.create.topics.enable": True,
        "num.partitions": 4,
    }
    with tempfile.TemporaryDirectory(prefix="kafka-python-suite-") as scratch:
        directory = args.keep or Path(scratch)
        directory.mkdir(parents=True, exist_ok=True)
        root = unpack_suite(directory)
        with InProcessBroker(settings=settings) as broker:
            port = broker.server.kafka_port
            assert port is not None
            return run(root, f"127.0.0.1:{port}", args.pytest_args)


if __name__ == "__main__":
    sys.exit(main())
