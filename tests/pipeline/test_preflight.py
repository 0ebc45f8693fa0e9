"""Checks before a JVM starts: Java, master URLs, size limits; and the examples' one-line errors (a
missing extra, no broker). Each failure is one line; none of these tests starts Spark."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
from click.testing import CliRunner

from streamassign.cli import main
from streamassign.pipeline import PipelineError, ScenarioModel, Workload, preflight

from .conftest import ORDERS, ROOT


def fake_java(folder: Path, version: str) -> Path:
    java = folder / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2024-01-01' >&2\n")
    java.chmod(0o755)
    return java


def test_java_is_found_on_the_path_or_in_java_home(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match=r"no Java found .* Spark needs Java 17\+"):
        preflight.check_java({"PATH": str(tmp_path)})
    with pytest.raises(PipelineError, match="JAVA_HOME=/nowhere has no bin/java"):
        preflight.check_java({"JAVA_HOME": "/nowhere", "PATH": ""})
    java = fake_java(tmp_path / "jdk17", "17.0.9")
    assert preflight.check_java({"JAVA_HOME": str(tmp_path / "jdk17")}) == str(java)
    assert preflight.check_java({"PATH": str(java.parent)}) == str(java)
    fake_java(tmp_path / "jdk8", "1.8.0_392")
    with pytest.raises(PipelineError, match="is Java 8: Spark needs Java 17"):
        preflight.check_java({"JAVA_HOME": str(tmp_path / "jdk8")})


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("echo 'Error: could not create the JVM' >&2; exit 1", "-version exited 1: Spark could"),
        ("exec sleep 30", "-version did not answer within 0.5 s: Spark could not start it"),
    ],
)
def test_a_java_that_fails_or_hangs_fails_before_spark(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, script: str, message: str
) -> None:
    """A new-user audit found a java exiting 1 passing the check (Spark then failed with a
    launcher error) and one that hangs hanging the whole command."""
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text(f"#!/bin/sh\n{script}\n")
    java.chmod(0o755)
    monkeypatch.setattr(preflight, "JAVA_VERSION_TIMEOUT_S", 0.5)
    with pytest.raises(PipelineError, match=message):
        preflight.check_java({"JAVA_HOME": str(tmp_path)})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_master_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    for good in (None, "local", "local[2]", "local[*]", "local[2,3]", "local-cluster[2,1,1024]"):
        preflight.check_master(good)
    for bad in ("sprak://nowhere", "local[x]", "spark://", "mesos://h:5050", "nowhere"):
        with pytest.raises(PipelineError, match="is not a Spark master URL"):
            preflight.check_master(bad)
    with pytest.raises(PipelineError, match="expected HOST:PORT"):
        preflight.check_master("spark://host-without-port")
    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    monkeypatch.delenv("YARN_CONF_DIR", raising=False)
    with pytest.raises(PipelineError, match="needs HADOOP_CONF_DIR or YARN_CONF_DIR"):
        preflight.check_master("yarn")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        preflight.check_master(f"spark://127.0.0.1:{port}")
        preflight.check_master(f"spark://127.0.0.1:{free_port()},127.0.0.1:{port}")  # HA list
    closed = free_port()
    started = time.monotonic()
    with pytest.raises(PipelineError, match=rf"cannot reach the Spark master .*:{closed}"):
        preflight.check_master(f"spark://127.0.0.1:{closed}")
    assert time.monotonic() - started < preflight.CONNECT_TIMEOUT_S + 1


def test_sizes_past_the_limits_are_refused(orders: Workload) -> None:
    preflight.check_size(orders, ScenarioModel())
    big = Workload.from_file(ORDERS, {"orders": 50_000, "customers": 50_000})
    preflight.check_size(big, ScenarioModel(expansion_per_hour=0.0))  # 50,004 tasks: allowed
    with pytest.raises(PipelineError, match=r"up to 200,016 after expansions .* 100,000 tasks"):
        preflight.check_size(big, ScenarioModel())
    with pytest.raises(PipelineError, match="max_clients=200,000: the limit is 100,000"):
        preflight.check_size(orders, attrs.evolve(ScenarioModel(), max_clients=200_000))


INT32_MAX = "orders=2147483647,customers=2147483647"


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", str(ORDERS), "-p", "orders=2147483648", "--num-clients", "2"], "2**31 - 1"),
        (
            ["plan", str(ORDERS), "-p", INT32_MAX, "--num-clients=2"],
            "has 2,147,483,651 tasks with these partition counts: the limit is 100,000",
        ),
        (["plan", str(ORDERS), "--num-clients", "1000000"], "the limit is 100,000"),
        (["simulate", str(ORDERS), "-p", "orders=5000000,customers=5000000"], "100,000 tasks"),
        (["simulate", str(ORDERS), "--master", "sprak://nowhere"], "not a Spark master URL"),
        (["plan-standbys", str(ORDERS), "--master", "local[x]"], "not a Spark master URL"),
        (["report", str(ROOT), "--master", "sprak://x"], "not a complete run"),
    ],
)
def test_cli_refuses_in_one_line_before_spark(
    monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    from streamassign.pipeline import spark as sp

    def no_spark(*a: Any, **k: Any) -> Any:
        raise AssertionError("a SparkSession was requested")

    monkeypatch.setattr(sp, "spark_session", no_spark)
    started = time.monotonic()
    code, out = invoke(*args)
    assert code != 0 and message in out, out
    assert "Traceback" not in out
    assert time.monotonic() - started < 10


def test_no_java_fails_before_spark(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from streamassign.pipeline import spark as sp

    monkeypatch.setattr(sp, "spark_session", None)  # any use fails loudly
    monkeypatch.setattr(preflight, "jvm_will_start", lambda: True)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    code, out = invoke("simulate", str(ORDERS), "--out", str(tmp_path / "run"))
    assert code == 1
    assert out.strip() == (
        "Error: no Java found (no java on the PATH, JAVA_HOME unset): Spark needs Java 17+, "
        "e.g. apt-get install openjdk-17-jre-headless"
    )
    assert not (tmp_path / "run").exists()


def python(*args: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` run from the repository root (where ``examples`` imports from)."""
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=60, check=False, cwd=ROOT
    )


@pytest.mark.parametrize("example", ["examples.orders_join", "examples.word_count"])
def test_examples_without_rocksdict_name_the_extra(example: str) -> None:
    """The App is built before any topic exists, so no broker is needed to see this."""
    script = (
        "import runpy, sys\n"
        "sys.modules['rocksdict'] = None  # as if the runtime extra were not installed\n"
        f"sys.argv = ['{example}', '--bootstrap', '127.0.0.1:9']\n"
        f"runpy.run_module('{example}', run_name='__main__')\n"
    )
    done = python("-c", script)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: store_kind='rocksdb' needs rocksdict, from the runtime extra: "
        "pip install 'streamassign[runtime]' (or use store_kind='memory')"
    )


@pytest.mark.parametrize("example", ["examples.orders_join", "examples.word_count"])
def test_examples_without_a_broker_end_in_one_error_line(example: str) -> None:
    """Nothing listens on port 1: the topic creation fails, the admin client and the apps are
    closed (no unclosed-resource warning in development mode), and the last line says so."""
    done = python("-X", "dev", "-m", example, "--bootstrap", "127.0.0.1:1")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "ResourceWarning" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot reach Kafka (KafkaConnectionError: Unable to bootstrap")
    assert last.endswith("is a broker running at --bootstrap?")
