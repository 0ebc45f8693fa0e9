"""The runtime examples' own input checks, before any broker is contacted: bad counts and a
missing extra end in one line, never a trace; a failure kept at stop ends them with 1."""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from streamassign.errors import OutputWriteError
from streamassign.runtime import App

ROOT = Path(__file__).resolve().parent.parent


def run_example(
    module: str, *args: str, hide: str | None = None, installed: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` from the repository root; ``hide``: a module made unimportable,
    as if its extra were not installed; ``installed``: versions pip's metadata reports for
    those distributions (as if another version were installed)."""
    code = "import importlib.metadata, runpy, sys\n"
    if hide:
        code += f"sys.modules[{hide!r}] = None\n"
    if installed:
        code += "real = importlib.metadata.version\n"
        code += f"importlib.metadata.version = lambda d: {installed!r}.get(d) or real(d)\n"
    code += f"sys.argv = [{module!r}, *{list(args)!r}]\n"
    code += f"runpy.run_module({module!r}, run_name='__main__')"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("module", "option", "value", "message"),
    [
        ("examples.orders_join", "--customers", "0", "argument --customers: 0 is below 1"),
        ("examples.orders_join", "--orders", "-5", "argument --orders: -5 is below 1"),
        ("examples.orders_join", "--orders", "many", "argument --orders: 'many' is not a whole"),
        ("examples.word_count", "--sentences", "0", "argument --sentences: 0 is below 1"),
    ],
)
def test_a_bad_count_is_one_line(module: str, option: str, value: str, message: str) -> None:
    done = run_example(module, "--bootstrap", "127.0.0.1:1", option, value)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    # As the README runs it, whatever sys.argv[0] is (python -m gives __main__.py).
    assert done.stderr.startswith(f"usage: python -m {module} [-h]"), done.stderr


@pytest.mark.parametrize("module", ["examples.orders_join", "examples.word_count"])
def test_without_the_runtime_extra_the_example_names_it(module: str) -> None:
    done = run_example(module, "--bootstrap", "127.0.0.1:1", hide="aiokafka")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: aiokafka is not installed: pip install 'streamassign[runtime]'"
    )


@pytest.mark.parametrize("module", ["examples.orders_join", "examples.word_count"])
def test_with_an_aiokafka_too_old_for_the_runtime_the_example_says_so(module: str) -> None:
    """Not that aiokafka is not installed, as it said: the guard's own line."""
    done = run_example(module, "--bootstrap", "127.0.0.1:1", installed={"aiokafka": "0.13.0"})
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: streamassign.runtime needs aiokafka>=0.14,<0.15, from the runtime extra, but "
        "aiokafka 0.13.0 is installed: pip install 'streamassign[runtime]'"
    )


class FakeProducer:
    """aiokafka's producer as the word count example uses it, keeping what it was sent."""

    sent: ClassVar[list[bytes]] = []

    def __init__(self, **config: object) -> None: ...

    async def start(self) -> None: ...

    async def send(self, topic: str, value: bytes, key: bytes) -> None:
        self.sent.append(value)

    async def flush(self) -> None: ...

    async def stop(self) -> None: ...


class FakeConsumer:
    """Reads back the word count example's output: each word's final count, at once."""

    def __init__(self, *topics: str, **config: object) -> None: ...

    async def start(self) -> None: ...

    async def getmany(self, timeout_ms: int) -> dict[str, list[SimpleNamespace]]:
        counts = Counter(w for s in FakeProducer.sent for w in s.decode().split())
        return {
            "out": [SimpleNamespace(key=w.encode(), value=b"%d" % n) for w, n in counts.items()]
        }

    async def stop(self) -> None: ...


@pytest.mark.parametrize("name", ["orders_join", "word_count"])
def test_an_example_whose_app_failed_at_stop_exits_1(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``stop()`` keeps a failed step (a commit at stop the broker refused) in
    ``app.failure`` rather than raising it; the examples, which call it themselves, exit 1
    and say so rather than report success (everything else here works: no broker needed)."""
    monkeypatch.syspath_prepend(str(ROOT))
    example = importlib.import_module(f"examples.{name}.__main__")

    class FailsAtStop(App):
        async def start(self) -> None: ...

        async def stop(self) -> None:
            await super().stop()
            self.failure = OutputWriteError("the commit at stop was refused")

    async def no_topics(bootstrap: str, partitions: object) -> None: ...

    monkeypatch.setattr(example, "App", FailsAtStop)
    monkeypatch.setattr(example, "create_topics", no_topics)
    if name == "orders_join":

        async def produce(*args: object) -> None: ...

        async def read_back(bootstrap: str, topic: str, count: int, timeout: float) -> list[Any]:
            return [{"order": o, "customer": None} for o in range(count)]

        monkeypatch.setattr(example, "produce", produce)
        monkeypatch.setattr(example, "read_back", read_back)
    else:
        monkeypatch.setattr(FakeProducer, "sent", [])
        monkeypatch.setattr(example, "AIOKafkaProducer", FakeProducer)
        monkeypatch.setattr(example, "AIOKafkaConsumer", FakeConsumer)
    argv = [name, "--bootstrap", "127.0.0.1:1", "--state-dir", str(tmp_path)]
    monkeypatch.setattr(
        sys, "argv", [*argv, "--orders" if name == "orders_join" else "--sentences", "3"]
    )
    assert asyncio.run(example.main()) == 1
    assert "the commit at stop was refused" in capsys.readouterr().err
