"""Dockerfile and docker-compose.yml: valid, and 0.0.0.0 only inside the container."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_is_accepted_by_docker_compose() -> None:
    binary = shutil.which("docker-compose")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("docker-compose is missing in CI: .ci/run installs it")
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    result = subprocess.run(
        [binary, "-f", "docker-compose.yml", "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()


def test_compose_service_has_volume_healthcheck_and_loopback_ports() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert "tidelog-data:/data" in text
    assert "healthcheck:" in text
    assert '"127.0.0.1:7410:7410"' in text  # published on the host's loopback only


def test_dockerfile_serves_on_all_interfaces_inside_and_checks_health() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert '"--listen", "0.0.0.0:7410"' in text
    assert "HEALTHCHECK" in text
    assert '"tidelog.broker", "healthcheck"' in text
    assert 'VOLUME ["/data"]' in text
    assert "USER tidelog" in text


def test_compose_runs_zookeeper_and_three_brokers_in_a_cluster() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert "image: zookeeper:3.8" in text
    for broker_id in (1, 2, 3):
        assert f'"broker.id={broker_id}"' in text
        assert f'"advertised.listeners=broker-{broker_id}:7410"' in text
    assert text.count('"zookeeper.connect=zookeeper:2181/tidelog"') == 3
    # The demo producer, the Spark job, the CDC connector, the CDC view, the search index.
    assert text.count('"broker-1:7410,broker-2:7410,broker-3:7410"') == 5


def test_compose_runs_postgres_the_cdc_connector_and_the_derived_views() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert "image: postgres:15" in text
    assert '"wal_level=logical"' in text
    assert '"cdc"\n      - "postgres"' in text
    for script in ("shop.py", "orders_view.py", "search_index.py"):
        assert f'"examples/cdc/{script}"' in text
        assert (ROOT / "examples" / "cdc" / script).is_file()
    assert 'pip install ".[spark,cdc]"' in (ROOT / "Dockerfile").read_text()


def test_the_ci_script_parses_and_ends_with_the_readmes_test_command() -> None:
    """CI runs ``.ci/run`` on a clean clone; a shell syntax error there (a merge once put
    a block inside a comment's backquotes) would fail CI before any test ran."""
    script = ROOT / ".ci" / "run"
    parsed = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert parsed.returncode == 0, parsed.stderr
    assert "make test" in (ROOT / "README.md").read_text()
    commands = [
        line.strip()
        for line in script.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert commands[-1] == "make test"
