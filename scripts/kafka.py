#!/usr/bin/env python3
"""Assemble, start and stop a throwaway single-node Apache Kafka broker for integration tests.

Kafka is not downloaded from kafka.apache.org: ``install`` generates a tiny Maven project that
depends on ``org.apache.kafka:kafka_2.13`` (plus a log4j2 binding) and lets
``maven-dependency-plugin:copy-dependencies`` put the runtime classpath into a cache directory.
``start`` formats fresh KRaft storage and launches ``kafka.Kafka`` as a combined
broker+controller on free 127.0.0.1 ports, then waits until the broker answers a Metadata
request with itself registered (unfenced). Only the standard library is used so the script runs
before any test dependency is installed.

Usage::

    python scripts/kafka.py install          # assemble + cache (fast no-op when cached)
    python scripts/kafka.py start            # prints the bootstrap address, e.g. 127.0.0.1:40123
    python scripts/kafka.py status
    python scripts/kafka.py stop
    python scripts/kafka.py run              # foreground; Ctrl-C stops the broker
    python scripts/kafka.py start --sasl --tls --scram-user app:app-secret --json
                                             # secured: SASL listeners and ACLs (--help)

Environment (all optional):
    STREAMASSIGN_KAFKA_VERSION        Kafka version to assemble (default: DEFAULT_VERSION).
    STREAMASSIGN_KAFKA_CACHE          cache root; installs go to <root>/kafka-<version>/
                                      (default: $XDG_CACHE_HOME/streamassign or ~/.cache/...).
    STREAMASSIGN_KAFKA_HEAP           JVM max heap (default: 512m).
    STREAMASSIGN_KAFKA_JVM_OPTS       extra JVM options appended to the defaults.
    STREAMASSIGN_KAFKA_START_TIMEOUT  seconds to wait for readiness (default: 90).
    JAVA_HOME                         JDK 17+ to use (default: ``java`` on PATH).
    MAVEN_OPTS                        passed to Maven by ``mvn`` itself, e.g.
                                      -Dmaven.repo.local=/tmp/m2 for an isolated local repo.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# 4.4.0 is the newest kafka_2.13 on Maven Central, but its publication is incomplete
# (kafka-tools-api, kafka-tools and kafka-streams 4.4.0 are missing), so it cannot be resolved.
DEFAULT_VERSION = "4.3.1"
SCALA_BINARY = "2.13"
LOG4J_VERSION = "2.25.3"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
MIN_JAVA = 17
DEFAULT_HEAP = "512m"
DEFAULT_START_TIMEOUT = 90.0
MAVEN_TIMEOUT = 1800.0
FORMAT_TIMEOUT = 120.0
STOP_TIMEOUT = 20.0
BIND_ATTEMPTS = 3
INSTALL_MARKER = "install.json"
NODE_ID = 1

# Defaults chosen for a 2-core CI box: C1-only JIT and SerialGC roughly halve startup CPU;
# the app-CDS archive created by ``install`` (when the JDK supports it) shaves another ~40%.
BASE_JVM_OPTS = (
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)

Log = Callable[[str], None]


class KafkaScriptError(RuntimeError):
    """Raised for any failure to install, start or stop the test broker (message is for humans)."""


def _stderr(message: str) -> None:
    print(f"[kafka.py] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# locations and environment
# --------------------------------------------------------------------------------------------


def default_version() -> str:
    """Kafka version to use: $STREAMASSIGN_KAFKA_VERSION or the pinned default."""
    return os.environ.get("STREAMASSIGN_KAFKA_VERSION") or DEFAULT_VERSION


def cache_root() -> Path:
    """Root of the cache; installs live in ``<root>/kafka-<version>``."""
    env = os.environ.get("STREAMASSIGN_KAFKA_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "streamassign").resolve()


def default_state_file() -> Path:
    """State file used by ``start``/``stop``/``status`` when --state-file is not given."""
    return cache_root() / "run" / "broker.json"


def default_start_timeout() -> float:
    """Readiness timeout: $STREAMASSIGN_KAFKA_START_TIMEOUT or DEFAULT_START_TIMEOUT."""
    raw = os.environ.get("STREAMASSIGN_KAFKA_START_TIMEOUT")
    try:
        return float(raw) if raw else DEFAULT_START_TIMEOUT
    except ValueError as exc:
        raise KafkaScriptError(f"STREAMASSIGN_KAFKA_START_TIMEOUT={raw!r} is not a number") from exc


def find_java() -> str:
    """Path of the ``java`` launcher ($JAVA_HOME first, then PATH)."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.exists():
            return str(candidate)
    found = shutil.which("java")
    if not found:
        raise KafkaScriptError(
            f"`java` not found: install a JDK/JRE {MIN_JAVA}+ (Kafka 4 needs Java {MIN_JAVA}) "
            "or set JAVA_HOME"
        )
    return found


def java_identity(java: str) -> tuple[int, str]:
    """Return (major version, short fingerprint of the exact JVM build) and enforce MIN_JAVA.

    The fingerprint keys the class-data-sharing archive, which is only valid for one JVM build.
    """
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KafkaScriptError(f"could not run `{java} -version`: {exc}") from exc
    text = out.stderr + out.stdout
    major = 0
    for token in text.split('"')[1::2]:  # version "17.0.15" / "1.8.0_392"
        parts = token.split(".")
        with contextlib.suppress(ValueError):
            major = int(parts[1]) if parts[0] == "1" else int(parts[0].split("-")[0])
            break
    if major < MIN_JAVA:
        raise KafkaScriptError(
            f"Kafka 4 needs Java {MIN_JAVA}+, but `{java} -version` says:\n{text.strip()}"
        )
    digest = hashlib.sha256((os.path.realpath(java) + "\n" + text).encode()).hexdigest()[:12]
    return major, digest


# --------------------------------------------------------------------------------------------
# install: assemble the broker classpath from Maven Central
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Installation:
    """An assembled Kafka runtime: ``libs/`` holds every jar of the broker classpath."""

    version: str
    home: Path

    @property
    def libs(self) -> Path:
        return self.home / "libs"

    @property
    def classpath(self) -> str:
        # A wildcard keeps the command line short and is expanded by the java launcher.
        return str(self.libs / "*")

    def cds_archive(self, java_fingerprint: str) -> Path:
        """Class-data-sharing archive for one JVM build (may not exist)."""
        return self.home / "cds" / f"kafka-{java_fingerprint}.jsa"


def _pom(version: str) -> str:
    deps = [
        ("org.apache.kafka", f"kafka_{SCALA_BINARY}", version),
        # Kafka 4 logs through slf4j 1.7 and ships log4j2 as its backend.
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
    ]
    dep_xml = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by streamassign scripts/kafka.py: runtime classpath of a Kafka {version} broker. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.streamassign</groupId>
  <artifactId>kafka-broker-runtime</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
{dep_xml}
  </dependencies>
</project>
"""


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive inter-process lock (POSIX flock; a no-op where fcntl is unavailable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _installed(home: Path, version: str) -> bool:
    marker = home / INSTALL_MARKER
    try:
        meta = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    jars = meta.get("jars", [])
    return (
        meta.get("version") == version
        and bool(jars)
        and all((home / "libs" / jar).is_file() for jar in jars)
    )


def _run_maven(project: Path, maven_repo: str | None, log: Log) -> None:
    mvn = shutil.which("mvn")
    maven_home = os.environ.get("MAVEN_HOME")
    if not mvn and maven_home and (Path(maven_home) / "bin" / "mvn").exists():
        mvn = str(Path(maven_home) / "bin" / "mvn")
    if not mvn:
        raise KafkaScriptError("Maven (`mvn`) not found on PATH: install Maven 3.6+")
    cmd = [
        mvn,
        "--batch-mode",
        "--no-transfer-progress",
        "--strict-checksums",
        "-f",
        str(project / "pom.xml"),
        f"{DEPENDENCY_PLUGIN}:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={project / 'libs'}",
    ]
    if maven_repo:
        cmd.append(f"-Dmaven.repo.local={Path(maven_repo).expanduser().resolve()}")
    log(f"resolving the broker classpath with Maven: {shlex.join(cmd[1:])}")
    try:
        proc = subprocess.run(
            cmd,
            cwd=project,
            capture_output=True,
            text=True,
            timeout=MAVEN_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise KafkaScriptError(f"Maven did not finish within {MAVEN_TIMEOUT:.0f}s") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise KafkaScriptError(f"Maven failed (exit {proc.returncode}):\n{tail}")


def install(
    version: str | None = None,
    *,
    maven_repo: str | None = None,
    force: bool = False,
    cds: bool = True,
    log: Log = _stderr,
) -> Installation:
    """Assemble Kafka ``version`` into the cache unless it is already there; return it.

    Idempotent and safe to run concurrently (a file lock serialises installers; the install is
    built in a scratch directory and renamed into place). With ``cds`` a class-data-sharing
    archive is trained once per JVM build by starting and stopping a broker.
    """
    version = version or default_version()
    root = cache_root()
    inst = Installation(version, root / f"kafka-{version}")
    if force or not _installed(inst.home, version):
        with _file_lock(root / f"kafka-{version}.lock"):
            if force or not _installed(inst.home, version):
                _assemble(inst, maven_repo, log)
    if cds:
        java = find_java()
        ensure_cds_archive(inst, java_identity(java)[1], log=log)
    return inst


def _assemble(inst: Installation, maven_repo: str | None, log: Log) -> None:
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix=f".kafka-{inst.version}-", dir=inst.home.parent))
    try:
        (scratch / "pom.xml").write_text(_pom(inst.version))
        _run_maven(scratch, maven_repo, log)
        jars = sorted(p.name for p in (scratch / "libs").glob("*.jar"))
        main_jar = f"kafka_{SCALA_BINARY}-{inst.version}.jar"
        if main_jar not in jars:
            raise KafkaScriptError(f"Maven finished but {main_jar} is not in {scratch / 'libs'}")
        meta = {
            "version": inst.version,
            "scala": SCALA_BINARY,
            "log4j": LOG4J_VERSION,
            "main_class": "kafka.Kafka",
            "format_class": "kafka.tools.StorageTool",
            "jars": jars,
            "assembled_seconds": round(time.monotonic() - started, 1),
        }
        (scratch / INSTALL_MARKER).write_text(json.dumps(meta, indent=2) + "\n")
        if inst.home.exists():
            shutil.rmtree(inst.home)  # stale/partial install, or --force (drops CDS too)
        os.replace(scratch, inst.home)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    log(
        f"assembled Kafka {inst.version} ({len(jars)} jars) in {inst.home} "
        f"in {time.monotonic() - started:.1f}s"
    )


def ensure_cds_archive(
    inst: Installation, java_fingerprint: str, *, log: Log = _stderr
) -> Path | None:
    """Create the app class-data-sharing archive for the current JVM build if missing.

    The archive is produced with -XX:ArchiveClassesAtExit by starting a broker until it is ready
    and stopping it cleanly (the JVM writes it on exit). Failure only costs startup speed, so it
    is reported, not raised.
    """
    archive = inst.cds_archive(java_fingerprint)
    if archive.is_file():
        return archive
    with _file_lock(inst.home / "cds.lock"):
        if archive.is_file():
            return archive
        archive.parent.mkdir(parents=True, exist_ok=True)
        partial = archive.with_suffix(f".{os.getpid()}.tmp")
        started = time.monotonic()
        try:
            broker = start_broker(
                inst.version,
                extra_jvm_opts=[f"-XX:ArchiveClassesAtExit={partial}"],
                use_cds=False,
                state_file=None,
                log=lambda _msg: None,
            )
            broker.stop(timeout=120.0)  # dumping the archive at exit takes a moment
        except KafkaScriptError as exc:
            log(f"warning: could not create a class-data-sharing archive (slower start): {exc}")
            partial.unlink(missing_ok=True)
            return None
        if not partial.is_file():
            log("warning: this JVM did not write a class-data-sharing archive (slower start)")
            return None
        os.replace(partial, archive)
        log(
            f"created class-data-sharing archive {archive.name} in "
            f"{time.monotonic() - started:.1f}s"
        )
        return archive


# --------------------------------------------------------------------------------------------
# broker configuration
# --------------------------------------------------------------------------------------------


def _free_ports(count: int) -> list[int]:
    """Ports the kernel considers free right now (all held open together, so distinct)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _random_cluster_id() -> str:
    """A Kafka cluster id: a URL-safe base64 UUID without padding (like ``kafka-storage``).

    Never one starting with ``-`` (1 in 64 otherwise), which ``format -t`` would read as an
    option and refuse; Kafka's own ``Uuid.randomUuid`` skips those for the same reason."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def server_properties(
    *, data_dir: Path, broker_port: int, controller_port: int, auto_create_topics: bool
) -> dict[str, str]:
    """Single-node KRaft (broker+controller) settings tuned for fast, small test runs."""
    return {
        "process.roles": "broker,controller",
        "node.id": str(NODE_ID),
        "controller.quorum.voters": f"{NODE_ID}@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{broker_port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{broker_port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data_dir),
        # One replica of everything, including internal topics.
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        # Tests create topics explicitly (partition counts matter for assignment tests); a
        # typo should fail loudly instead of silently creating a 1-partition topic.
        "auto.create.topics.enable": str(auto_create_topics).lower(),
        "delete.topic.enable": "true",
        # Fast group coordination; let tests use short session timeouts.
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "1000",
        "auto.leader.rebalance.enable": "false",
        # Small footprint: fewer threads (2 cores), small segments/indexes, small cleaner buffer
        # (the default 128 MiB dedupe buffer would take a quarter of a 512 MiB heap).
        "num.network.threads": "2",
        "num.io.threads": "4",
        "background.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "log.cleaner.threads": "1",
        "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
        "log.segment.bytes": str(1024 * 1024),
        "log.index.size.max.bytes": str(1024 * 1024),
    }


_LOG4J2 = """\
# Generated by streamassign scripts/kafka.py
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


SCRAM_MECHANISM = "SCRAM-SHA-512"
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
#: The super user ``--sasl`` always creates, for tests that set up topics and ACLs over SASL.
ADMIN_USER = ("admin", "admin-secret")
#: keytool's store password for the generated TLS material (test-only, not a secret).
TLS_STORE_PASSWORD = "streamassign-test"
TLS_VALIDITY_DAYS = 3650
#: Regenerate the cached TLS material once it is older than this (well before it expires).
TLS_MAX_AGE_DAYS = 365
KEYTOOL_TIMEOUT = 120.0
#: What ``ensure_tls_files`` writes last, once both files are in place: the files' format
#: (raised when the way they are made changes, so older caches are made again) and each
#: file's sha256, so a truncated or edited cache is made again rather than trusted.
TLS_MARKER = "made.json"
TLS_FORMAT = 2


@dataclasses.dataclass(frozen=True)
class Security:
    """A secured broker: a SASL_PLAINTEXT listener (SCRAM-SHA-512 only) and, with ``tls``, a
    SASL_SSL one (certificate from a self-signed test CA, naming 127.0.0.1), every request
    authorized by Kafka's StandardAuthorizer (``allow.everyone.if.no.acl.found=false``).

    ``users`` (name, password) get SCRAM-SHA-512 credentials at format time, besides
    ``ADMIN_USER``, a super user. The PLAINTEXT listener stays (the readiness probe and the
    broker's own requests use it): its principal, ``User:ANONYMOUS``, is a super user as the
    controller listener's must be, so a test sets up topics and ACLs there and points the
    clients under test at the SASL port.
    """

    users: tuple[tuple[str, str], ...] = ()
    tls: bool = False

    def all_users(self) -> list[tuple[str, str]]:
        return [ADMIN_USER, *(u for u in self.users if u[0] != ADMIN_USER[0])]

    def scram_arguments(self) -> list[str]:
        """``kafka-storage format`` arguments creating every user's credentials."""
        out = []
        for name, password in self.all_users():
            bad = [c for c in '[],="' if c in name + password]
            if not name or not password or bad:
                raise KafkaScriptError(
                    f"SCRAM user {name!r}: name and password must be non-empty, without "
                    'any of [ ] , = "'
                )
            out += ["--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={password}]"]
        return out


def secure(
    props: dict[str, str], sasl_port: int, sasl_ssl_port: int | None, tls: TlsFiles | None
) -> None:
    """Add a ``Security`` broker's listeners and authorizer to ``server_properties``'s."""
    listeners = {"SASL_PLAINTEXT": sasl_port}
    if sasl_ssl_port is not None:
        listeners["SASL_SSL"] = sasl_ssl_port
    for name, port in listeners.items():
        props["listeners"] += f",{name}://127.0.0.1:{port}"
        props["advertised.listeners"] += f",{name}://127.0.0.1:{port}"
        props["listener.security.protocol.map"] += f",{name}:{name}"
        # SCRAM needs a login module on the server side too (credentials come from metadata).
        props[f"listener.name.{name.lower()}.scram-sha-512.sasl.jaas.config"] = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        )
    props.update(
        {
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            "authorizer.class.name": STANDARD_AUTHORIZER,
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:ANONYMOUS;User:{ADMIN_USER[0]}",
        }
    )
    if tls is not None:
        props.update(
            {
                "listener.name.sasl_ssl.ssl.keystore.type": "PKCS12",
                "listener.name.sasl_ssl.ssl.keystore.location": str(tls.keystore),
                "listener.name.sasl_ssl.ssl.keystore.password": TLS_STORE_PASSWORD,
                "listener.name.sasl_ssl.ssl.key.password": TLS_STORE_PASSWORD,
            }
        )


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """The SASL_SSL listener's keystore and the test CA's certificate (PEM, for clients)."""

    keystore: Path
    ca_pem: Path


def find_keytool(java: str) -> str:
    """The JDK's ``keytool``: beside ``java`` once its links are resolved (``/usr/bin/java`` is
    a link to the JDK's, through ``/etc/alternatives`` on Debian), else the one on PATH."""
    beside = Path(os.path.realpath(java)).with_name("keytool")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("keytool")
    if found:
        return found
    raise KafkaScriptError(
        f"`keytool` not found beside {java} ({beside}) nor on PATH: --tls makes its test CA "
        "with the JDK's keytool (install a full JDK, or set JAVA_HOME to one)"
    )


def _keytool(keytool: str, *args: str, stdin: str | None = None) -> str:
    cmd = [keytool, "-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC", *args]
    try:
        done = subprocess.run(
            cmd, input=stdin, capture_output=True, text=True, timeout=KEYTOOL_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KafkaScriptError(f"could not run keytool: {exc}") from exc
    if done.returncode != 0:
        raise KafkaScriptError(
            f"keytool failed (exit {done.returncode}): $ {shlex.join(cmd)}\n"
            f"{(done.stdout + done.stderr).strip()[-2000:]}"
        )
    return done.stdout


def ensure_tls_files(java: str, log: Log = _stderr) -> TlsFiles:
    """A self-signed test CA and a broker certificate it signed (SAN IP:127.0.0.1), made with
    the JDK's keytool once and cached under the cache root (about 6 JVM starts, so a
    fresh broker does not pay them); made again after ``TLS_MAX_AGE_DAYS``, or when the
    cache is damaged or of an older format (``TLS_MARKER``)."""
    home = cache_root() / "tls"
    files = TlsFiles(home / "broker.p12", home / "ca.pem")
    max_age = TLS_MAX_AGE_DAYS * 86400

    def fresh() -> bool:
        try:
            marker = json.loads((home / TLS_MARKER).read_text())
            return (
                marker.get("format") == TLS_FORMAT
                and marker.get("sha256") == _tls_digests(files)
                and time.time() - (home / TLS_MARKER).stat().st_mtime < max_age
            )
        except (OSError, ValueError, AttributeError):  # missing, damaged: made again
            return False

    if fresh():
        return files
    with _file_lock(cache_root() / "tls.lock"):
        if fresh():
            return files
        started = time.monotonic()
        scratch = Path(tempfile.mkdtemp(prefix=".tls-", dir=cache_root()))
        try:
            _make_tls_files(java, scratch)
            made = TlsFiles(scratch / files.keystore.name, scratch / files.ca_pem.name)
            marker = {"format": TLS_FORMAT, "sha256": _tls_digests(made)}
            (scratch / TLS_MARKER).write_text(json.dumps(marker))
            if home.exists():
                shutil.rmtree(home)
            os.replace(scratch, home)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        log(f"created the test CA and broker certificate in {time.monotonic() - started:.1f}s")
    return files


def _tls_digests(files: TlsFiles) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in dataclasses.astuple(files)}


def _make_tls_files(java: str, into: Path) -> None:
    keytool = find_keytool(java)
    ca, broker = str(into / "ca.p12"), str(into / "broker.p12")
    common = ["-storetype", "PKCS12", "-storepass", TLS_STORE_PASSWORD]
    key = ["-keyalg", "EC", "-groupname", "secp256r1", "-validity", str(TLS_VALIDITY_DAYS)]
    _keytool(
        keytool,
        "-genkeypair",
        "-alias",
        "ca",
        "-dname",
        "CN=streamassign test CA",
        "-ext",
        "bc:c",
        "-ext",  # a CA without key usage fails Python 3.13's default (strict) verification
        "KeyUsage:c=keyCertSign,cRLSign",
        *key,
        "-keystore",
        ca,
        *common,
    )
    _keytool(
        keytool,
        "-genkeypair",
        "-alias",
        "broker",
        "-dname",
        "CN=127.0.0.1",
        *key,
        "-keystore",
        broker,
        *common,
    )
    request = _keytool(keytool, "-certreq", "-alias", "broker", "-keystore", broker, *common)
    signed = _keytool(
        keytool,
        "-gencert",
        "-alias",
        "ca",
        "-keystore",
        ca,
        *common,
        "-rfc",
        "-validity",
        str(TLS_VALIDITY_DAYS),
        "-ext",
        "SAN=IP:127.0.0.1",
        stdin=request,
    )
    ca_pem = _keytool(keytool, "-exportcert", "-alias", "ca", "-keystore", ca, *common, "-rfc")
    (into / "ca.pem").write_text(ca_pem)
    (into / "broker.pem").write_text(signed)
    _keytool(
        keytool,
        "-importcert",
        "-noprompt",
        "-alias",
        "ca",
        "-file",
        str(into / "ca.pem"),
        "-keystore",
        broker,
        *common,
    )
    _keytool(
        keytool,
        "-importcert",
        "-alias",
        "broker",
        "-file",
        str(into / "broker.pem"),
        "-keystore",
        broker,
        *common,
    )
    (into / "ca.p12").unlink()  # the CA's private key is not needed again


# --------------------------------------------------------------------------------------------
# readiness probe: a minimal Kafka protocol client (ApiVersions v0 + Metadata v4..v8)
# --------------------------------------------------------------------------------------------


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        chunks += chunk
    return bytes(chunks)


def _call(sock: socket.socket, api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    client_id = b"streamassign-probe"
    header = struct.pack(">hhih", api_key, version, correlation, len(client_id)) + client_id
    payload = header + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    response = _recv_exact(sock, size)
    (got,) = struct.unpack_from(">i", response)
    if got != correlation:
        raise ConnectionError(f"correlation id mismatch ({got} != {correlation})")
    return response[4:]


def live_broker_count(host: str, port: int, timeout: float = 2.0) -> int:
    """Number of unfenced brokers in a Metadata response; raises OSError if not answering.

    Fenced (still starting) brokers are left out of Metadata responses, so a count >= 1 means the
    broker accepts connections, processes requests and can host partitions.
    """
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        versions = _call(sock, api_key=18, version=0, correlation=1, body=b"")
        error, count = struct.unpack_from(">hi", versions)
        if error:
            raise ConnectionError(f"ApiVersions error code {error}")
        ranges = {
            k: (lo, hi) for k, lo, hi in struct.iter_unpack(">hhh", versions[6 : 6 + 6 * count])
        }
        low, high = ranges.get(3, (0, -1))
        version = max(low, 4)
        if version > min(high, 8):
            raise KafkaScriptError(f"broker supports Metadata v{low}..v{high}; probe needs v4..v8")
        # topics=[] (none), allow_auto_topic_creation=false (+ two auth flags from v8)
        body = struct.pack(">i?", 0, False) + (b"\x00\x00" if version >= 8 else b"")
        metadata = _call(sock, api_key=3, version=version, correlation=2, body=body)
        _throttle, brokers = struct.unpack_from(">ii", metadata)
        return int(brokers)


# --------------------------------------------------------------------------------------------
# start / stop
# --------------------------------------------------------------------------------------------


#: ``BrokerInfo``'s fields of a secured broker (``--sasl``, ``--tls``), left out of a plain one's.
SECURITY_FIELDS = ("sasl_bootstrap", "sasl_ssl_bootstrap", "ca_file")


@dataclasses.dataclass
class BrokerInfo:
    """What ``start`` records in the state file (and what ``stop`` needs)."""

    version: str
    pid: int
    bootstrap: str
    controller: str
    cluster_id: str
    data_dir: str
    owns_data_dir: bool
    log_file: str
    started_at: float
    startup_seconds: float
    #: ``--sasl`` only: the SASL_PLAINTEXT (SCRAM-SHA-512) listener's address, and with
    #: ``--tls`` the SASL_SSL one's and the PEM file of the CA that signed its certificate.
    sasl_bootstrap: str = ""
    sasl_ssl_bootstrap: str = ""
    ca_file: str = ""

    @classmethod
    def load(cls, path: Path) -> BrokerInfo:
        try:
            raw = json.loads(path.read_text())
            optional = {f.name for f in dataclasses.fields(cls) if f.default != dataclasses.MISSING}
            return cls(
                **{
                    f.name: raw[f.name]
                    for f in dataclasses.fields(cls)
                    if f.name in raw or f.name not in optional
                }
            )
        except FileNotFoundError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KafkaScriptError(f"unreadable state file {path}: {exc}") from exc

    def as_dict(self) -> dict[str, Any]:
        """The fields to record and print: those of ``--sasl`` only when it is secured
        (``load`` reads them as empty when absent)."""
        fields = dataclasses.asdict(self)
        return {k: v for k, v in fields.items() if v or k not in SECURITY_FIELDS}

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.as_dict(), indent=2) + "\n")
        os.replace(tmp, path)


class Broker:
    """A broker started by this process; ``stop()`` is idempotent."""

    def __init__(
        self, info: BrokerInfo, process: subprocess.Popen[bytes], state_file: Path | None
    ) -> None:
        self.info = info
        self.process = process
        self.state_file = state_file

    @property
    def bootstrap(self) -> str:
        return self.info.bootstrap

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the JVM (SIGTERM, then SIGKILL after ``timeout``) and clean up."""
        _terminate(self.process.pid, timeout, self.process)
        _cleanup(self.info, self.state_file)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes (Linux only)
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _is_our_broker(info: BrokerInfo) -> bool:
    """Guard against pid reuse: the process must be a JVM using this broker's data dir."""
    try:
        cmdline = Path(f"/proc/{info.pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        try:
            cmdline = subprocess.run(
                ["ps", "-o", "args=", "-p", str(info.pid)],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return False
    return "kafka.Kafka" in cmdline and info.data_dir in cmdline


def _terminate(pid: int, timeout: float, process: subprocess.Popen[bytes] | None = None) -> None:
    def gone() -> bool:
        if process is not None:
            return process.poll() is not None
        return not _pid_alive(pid)

    if gone():
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone():
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if process is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)


def _cleanup(info: BrokerInfo, state_file: Path | None) -> None:
    if info.owns_data_dir:
        shutil.rmtree(info.data_dir, ignore_errors=True)
    if state_file is not None:
        with contextlib.suppress(FileNotFoundError):
            if BrokerInfo.load(state_file).pid == info.pid:
                state_file.unlink()


def log_tail(path: Path | str, lines: int = 60) -> str:
    """Last ``lines`` lines of a log file, without the broker's config dump ("\tkey = value").

    Returns an empty string if the file is unreadable.
    """
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 256 * 1024))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    kept = [line for line in text.splitlines() if not line.startswith("\t")]
    return "\n".join(kept[-lines:])


def die_with_parent_preexec() -> Callable[[], None] | None:
    """preexec_fn making the child (the JVM; the test suite's worker processes too) get
    SIGKILL when this process dies (Linux prctl), else None. The kernel ties it to the
    thread that forks: start the child from a thread that lives as long as this process."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != parent:  # parent already died between fork and prctl
            os._exit(1)

    return preexec


class _PortInUseError(Exception):
    """The broker lost the race for a port picked by _free_ports; retry with new ports."""


def _refuse_if_running(state_path: Path) -> None:
    try:
        old = BrokerInfo.load(state_path)
    except (FileNotFoundError, KafkaScriptError):
        return
    if _pid_alive(old.pid) and _is_our_broker(old):
        raise KafkaScriptError(
            f"a broker is already running at {old.bootstrap} (pid {old.pid}, state "
            f"{state_path}); stop it first or pass another --state-file"
        )


def start_broker(
    version: str | None = None,
    *,
    data_dir: Path | str | None = None,
    state_file: Path | str | None = None,
    heap: str | None = None,
    timeout: float | None = None,
    auto_create_topics: bool = False,
    properties: dict[str, str] | None = None,
    extra_jvm_opts: list[str] | None = None,
    use_cds: bool = True,
    die_with_parent: bool = False,
    maven_repo: str | None = None,
    security: Security | None = None,
    log: Log = _stderr,
) -> Broker:
    """Format fresh KRaft storage, launch a single-node broker and wait until it is ready.

    ``data_dir`` must be empty or missing; when omitted a temp dir is created and removed again
    by ``stop`` (or right away if the start fails; the error carries the log tail).
    ``properties`` override/extend the generated server.properties; ``extra_jvm_opts`` apply
    to the broker JVM only (not to the storage-format step). ``die_with_parent`` ties
    the JVM's life to this process (Linux), which is what a test fixture wants; the CLI
    ``start`` leaves it detached instead. ``security`` adds SASL listeners and ACLs
    (``Security``); the PLAINTEXT ``bootstrap`` stays, as a super user's port.
    """
    version = version or default_version()
    timeout = default_start_timeout() if timeout is None else timeout
    state_path = Path(state_file) if state_file is not None else None
    if state_path is not None:
        _refuse_if_running(state_path)
    java = find_java()
    _, fingerprint = java_identity(java)
    inst = install(version, maven_repo=maven_repo, cds=False, log=log)
    tls = ensure_tls_files(java, log) if security is not None and security.tls else None
    if use_cds:
        ensure_cds_archive(inst, fingerprint, log=log)

    owns = data_dir is None
    if data_dir is None:
        root = Path(tempfile.mkdtemp(prefix="streamassign-kafka-")).resolve()
    else:
        root = Path(data_dir).resolve()
        root.mkdir(parents=True, exist_ok=True)
        if any(root.iterdir()):
            raise KafkaScriptError(f"data dir {root} is not empty; give an empty or new directory")

    jvm_opts = [f"-Xmx{heap or os.environ.get('STREAMASSIGN_KAFKA_HEAP') or DEFAULT_HEAP}"]
    jvm_opts += BASE_JVM_OPTS
    archive = inst.cds_archive(fingerprint)
    if use_cds and archive.is_file():
        jvm_opts.append(f"-XX:SharedArchiveFile={archive}")
    jvm_opts += shlex.split(os.environ.get("STREAMASSIGN_KAFKA_JVM_OPTS", ""))

    try:
        for attempt in range(1, BIND_ATTEMPTS + 1):
            try:
                return _launch(
                    inst,
                    [java, *jvm_opts],
                    broker_jvm_opts=extra_jvm_opts or [],
                    root=root,
                    owns=owns,
                    state_path=state_path,
                    timeout=timeout,
                    auto_create_topics=auto_create_topics,
                    properties=properties or {},
                    die_with_parent=die_with_parent,
                    security=security,
                    tls=tls,
                    log=log,
                )
            except _PortInUseError:
                log(f"a chosen port was taken before Kafka bound it (attempt {attempt})")
        raise KafkaScriptError(f"could not bind free ports after {BIND_ATTEMPTS} attempts")
    except BaseException:
        if owns:
            shutil.rmtree(root, ignore_errors=True)
        raise


def _launch(
    inst: Installation,
    jvm: list[str],
    *,
    broker_jvm_opts: list[str],
    root: Path,
    owns: bool,
    state_path: Path | None,
    timeout: float,
    auto_create_topics: bool,
    properties: dict[str, str],
    die_with_parent: bool,
    security: Security | None,
    tls: TlsFiles | None,
    log: Log,
) -> Broker:
    """One attempt: write config, format storage, spawn ``kafka.Kafka``, wait for readiness."""
    started = time.monotonic()
    kraft, logs = root / "kraft", root / "logs"
    shutil.rmtree(kraft, ignore_errors=True)  # leftovers of a failed attempt
    shutil.rmtree(logs, ignore_errors=True)  # so the log tail only shows this attempt
    logs.mkdir(parents=True)
    # A secured broker's SASL_PLAINTEXT and SASL_SSL listeners take the third and fourth.
    ports = _free_ports(2 + (security is not None) + (tls is not None))
    broker_port, controller_port = ports[:2]
    props = server_properties(
        data_dir=kraft,
        broker_port=broker_port,
        controller_port=controller_port,
        auto_create_topics=auto_create_topics,
    )
    if security is not None:
        secure(props, ports[2], ports[3] if tls is not None else None, tls)
    props.update(properties)
    config = root / "server.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    log_file = logs / "server.log"
    log4j = root / "log4j2.properties"
    log4j.write_text(_LOG4J2.format(log_file=log_file.as_posix()))
    base = [*jvm, f"-Dlog4j2.configurationFile={log4j}", "-cp", inst.classpath]
    cluster_id = _random_cluster_id()

    fmt_cmd = [*base, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config)]
    if security is not None:
        fmt_cmd += security.scram_arguments()
    try:
        fmt = subprocess.run(
            fmt_cmd, capture_output=True, text=True, timeout=FORMAT_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise KafkaScriptError(f"formatting storage timed out after {FORMAT_TIMEOUT:.0f}s") from exc
    if fmt.returncode != 0:
        raise KafkaScriptError(
            f"formatting KRaft storage failed (exit {fmt.returncode}):\n"
            f"$ {shlex.join(fmt_cmd)}\n{(fmt.stdout + fmt.stderr).strip()[-4000:]}"
        )

    stdout_file = logs / "stdout.log"
    with open(stdout_file, "wb") as out:
        process = subprocess.Popen(
            [*base, *broker_jvm_opts, "kafka.Kafka", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=root,
            start_new_session=True,  # terminal Ctrl-C goes to us; we stop the broker in order
            preexec_fn=die_with_parent_preexec() if die_with_parent else None,
        )
    bootstrap = f"127.0.0.1:{broker_port}"
    info = BrokerInfo(
        version=inst.version,
        pid=process.pid,
        bootstrap=bootstrap,
        controller=f"127.0.0.1:{controller_port}",
        cluster_id=cluster_id,
        data_dir=str(root),
        owns_data_dir=owns,
        log_file=str(log_file),
        started_at=time.time(),
        startup_seconds=0.0,
    )
    if security is not None:
        info.sasl_bootstrap = f"127.0.0.1:{ports[2]}"
    if tls is not None:
        info.sasl_ssl_bootstrap = f"127.0.0.1:{ports[3]}"
        info.ca_file = str(tls.ca_pem)
    if state_path is not None:
        info.save(state_path)  # lets `stop` clean up even if we die while waiting
    broker = Broker(info, process, state_path)
    try:
        _wait_ready(process, broker_port, timeout, log_file, stdout_file)
    except BaseException:
        _terminate(process.pid, 5.0, process)
        if state_path is not None:
            with contextlib.suppress(FileNotFoundError):
                state_path.unlink()
        raise
    info.startup_seconds = round(time.monotonic() - started, 2)
    if state_path is not None:
        info.save(state_path)
    log(
        f"Kafka {inst.version} ready at {bootstrap} in {info.startup_seconds:.2f}s "
        f"(pid {process.pid}, log {log_file})"
    )
    return broker


def _tails(log_file: Path, stdout: Path) -> str:
    parts = [f"--- tail of {log_file} ---\n{log_tail(log_file)}"]
    out = log_tail(stdout, 30).strip()
    if out:
        parts.append(f"--- tail of {stdout} ---\n{out}")
    return "\n".join(parts)


def _wait_ready(
    process: subprocess.Popen[bytes], port: int, timeout: float, log_file: Path, stdout: Path
) -> None:
    """Poll the Metadata probe until the broker is live; fail on exit or after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_error = "no answer yet"
    while True:
        code = process.poll()
        if code is not None:
            tails = _tails(log_file, stdout)
            if "Address already in use" in tails:
                raise _PortInUseError()
            raise KafkaScriptError(f"Kafka exited with code {code} during startup.\n{tails}")
        try:
            if live_broker_count("127.0.0.1", port, timeout=2.0) >= 1:
                return
            last_error = "broker not registered/unfenced yet"
        except (OSError, struct.error) as exc:
            last_error = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise KafkaScriptError(
                f"Kafka was not ready on 127.0.0.1:{port} after {timeout:g}s "
                f"(last probe: {last_error}).\n{_tails(log_file, stdout)}"
            )
        time.sleep(0.1)


def stop_from_state(state_file: Path, timeout: float = STOP_TIMEOUT, log: Log = _stderr) -> bool:
    """Stop the broker recorded in ``state_file``; return False if there was nothing to stop."""
    try:
        info = BrokerInfo.load(state_file)
    except FileNotFoundError:
        return False
    if _pid_alive(info.pid) and _is_our_broker(info):
        _terminate(info.pid, timeout)
        log(f"stopped Kafka at {info.bootstrap} (pid {info.pid})")
    else:
        log(f"Kafka pid {info.pid} is not running; cleaning up its state")
    _cleanup(info, state_file)
    return True


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--version",
            dest="kafka_version",
            default=None,
            help=f"Kafka version (default: {default_version()})",
        )
        p.add_argument(
            "--maven-repo",
            default=None,
            help="Maven local repository to use instead of ~/.m2/repository",
        )
        p.add_argument(
            "--no-cds",
            action="store_true",
            help="skip the class-data-sharing archive (slower start)",
        )

    def state(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--state-file",
            type=Path,
            default=None,
            help=f"state file (default: {default_state_file()})",
        )

    p_install = sub.add_parser("install", help="assemble Kafka from Maven Central into the cache")
    common(p_install)
    p_install.add_argument("--force", action="store_true", help="re-assemble even if cached")

    for name, text in (
        ("start", "start a broker in the background and print its bootstrap"),
        ("run", "start a broker in the foreground until Ctrl-C"),
    ):
        p = sub.add_parser(name, help=text)
        common(p)
        state(p)
        p.add_argument(
            "--data-dir",
            type=Path,
            default=None,
            help="empty dir for data+logs (default: a temp dir removed by stop)",
        )
        p.add_argument("--heap", default=None, help=f"JVM max heap (default: {DEFAULT_HEAP})")
        p.add_argument(
            "--timeout",
            type=float,
            default=None,
            help=f"readiness timeout in seconds (default: {DEFAULT_START_TIMEOUT:.0f})",
        )
        p.add_argument(
            "--auto-create-topics",
            action="store_true",
            help="enable auto.create.topics.enable (off by default)",
        )
        p.add_argument(
            "--property",
            "-p",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="extra/overriding server.properties entry (repeatable)",
        )
        p.add_argument(
            "--sasl",
            action="store_true",
            help=(
                "secured broker: add a SASL_PLAINTEXT listener (SCRAM-SHA-512 only) and "
                "Kafka's StandardAuthorizer (allow.everyone.if.no.acl.found=false); SCRAM "
                f"user {ADMIN_USER[0]}/{ADMIN_USER[1]} is a super user, and so is the "
                "PLAINTEXT listener's User:ANONYMOUS (for setting up topics and ACLs); "
                "prints the SASL_PLAINTEXT address (the others: --json)"
            ),
        )
        p.add_argument(
            "--scram-user",
            action="append",
            default=[],
            metavar="NAME:PASSWORD",
            help="with --sasl: another SCRAM-SHA-512 user, with no ACL (repeatable)",
        )
        p.add_argument(
            "--tls",
            action="store_true",
            help=(
                "with --sasl: also a SASL_SSL listener, its certificate (for IP 127.0.0.1) "
                "signed by a test CA made once with the JDK's keytool and cached; the CA's "
                "PEM file is ca_file in --json"
            ),
        )
        p.add_argument("--json", action="store_true", help="print the state as JSON")

    p_stop = sub.add_parser("stop", help="stop the broker recorded in the state file")
    state(p_stop)
    p_stop.add_argument(
        "--timeout",
        type=float,
        default=STOP_TIMEOUT,
        help="seconds to wait after SIGTERM before SIGKILL",
    )
    p_status = sub.add_parser("status", help="print the state of the recorded broker")
    state(p_status)
    return parser


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    state_file: Path = getattr(args, "state_file", None) or default_state_file()
    try:
        if args.command == "install":
            started = time.monotonic()
            inst = install(
                args.kafka_version,
                maven_repo=args.maven_repo,
                force=args.force,
                cds=not args.no_cds,
            )
            _stderr(
                f"Kafka {inst.version} installed in {inst.home} ({time.monotonic() - started:.1f}s)"
            )
            print(inst.home)
        elif args.command in ("start", "run"):
            broker = start_broker(
                args.kafka_version,
                data_dir=args.data_dir,
                state_file=state_file,
                heap=args.heap,
                timeout=args.timeout,
                auto_create_topics=args.auto_create_topics,
                properties=_parse_properties(args.property),
                use_cds=not args.no_cds,
                die_with_parent=args.command == "run",
                maven_repo=args.maven_repo,
                security=_security(args.sasl, args.scram_user, args.tls),
            )
            address = broker.info.sasl_bootstrap or broker.bootstrap
            out: Any = broker.info.as_dict() if args.json else address
            print(json.dumps(out, indent=2) if args.json else out, flush=True)
            if args.command == "run":
                _run_foreground(broker)
        elif args.command == "stop":
            if not stop_from_state(state_file, args.timeout):
                _stderr(f"no broker recorded in {state_file}")
        elif args.command == "status":
            try:
                info = BrokerInfo.load(state_file)
            except FileNotFoundError:
                _stderr(f"no broker recorded in {state_file}")
                return 1
            running = _pid_alive(info.pid) and _is_our_broker(info)
            print(json.dumps({**info.as_dict(), "running": running}, indent=2))
            return 0 if running else 1
    except KafkaScriptError as exc:
        _stderr(f"error: {exc}")
        return 1
    return 0


def _security(sasl: bool, users: list[str], tls: bool) -> Security | None:
    if not sasl:
        if users or tls:
            raise KafkaScriptError("--scram-user and --tls need --sasl")
        return None
    parsed = []
    for item in users:
        name, sep, password = item.partition(":")
        if not sep:
            raise KafkaScriptError(f"--scram-user expects NAME:PASSWORD, got {item!r}")
        parsed.append((name, password))
    return Security(users=tuple(parsed), tls=tls)


def _parse_properties(items: list[str]) -> dict[str, str]:
    props = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise KafkaScriptError(f"--property expects KEY=VALUE, got {item!r}")
        props[key.strip()] = value.strip()
    return props


def _run_foreground(broker: Broker) -> None:
    """Block until Ctrl-C/SIGTERM or the broker dies, then stop it."""

    def on_sigterm(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        code = broker.process.wait()
        _stderr(f"Kafka exited unexpectedly with code {code}; log: {broker.info.log_file}")
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
