"""Word count with a repartition topic on the streamassign runtime (see README.md).

    python -m examples.word_count --bootstrap 127.0.0.1:9092

Subtopology 0 splits sentences into words and re-keys them by word through the repartition
topic; subtopology 1 counts words in a RocksDB store and writes running counts to an output
topic. The runtime creates the repartition and changelog topics.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import uuid
from pathlib import Path

from streamassign import Subtopology, Topology
from streamassign.errors import ExtraVersionError

try:  # without the runtime extra: one line naming what is missing, not a trace
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from streamassign.runtime import App, Record, TaskContext

    from ..demo import count, create_topics, run
except ExtraVersionError as exc:  # installed, but too old: its line says which, and the fix
    sys.exit(f"error: {exc}")
except ModuleNotFoundError as exc:
    sys.exit(f"error: {exc.name} is not installed: pip install 'streamassign[runtime]'")

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "and",
    "the",
    "dog",
    "sleeps",
]


def word_count_topology(app: str, sentences: str, output: str) -> Topology:
    words = f"{app}-words-repartition"
    return Topology(
        [
            Subtopology(0, [sentences], sink_topics=[words]),
            Subtopology(1, [words], stores=["counts"], sink_topics=[output]),
        ],
        repartition_topics={words: None},  # as many partitions as `sentences`
        name=app,
    )


class Split:
    def __init__(self, words: str) -> None:
        self.words = words

    async def process(self, ctx: TaskContext, record: Record) -> None:
        for word in (record.value or b"").decode().lower().split():
            ctx.send(self.words, b"1", key=word.encode())  # partitioned by word


class Count:
    def __init__(self, output: str) -> None:
        self.output = output

    async def process(self, ctx: TaskContext, record: Record) -> None:
        counts = ctx.store("counts")
        key = record.key or b""
        total = int(counts.get(key) or b"0") + int(record.value or b"0")
        counts.put(key, str(total).encode())
        ctx.send(self.output, str(total).encode(), key=key)


async def main() -> int:
    """Run the demo; the exit status is 1 if the counts do not match what was produced."""
    ap = argparse.ArgumentParser(
        prog="python -m examples.word_count",  # not __main__.py: how the README runs it
        description="Word count with a repartition topic",
    )
    ap.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers (host:port)")
    ap.add_argument("--sentences", type=count(1), default=1000)
    ap.add_argument("--threads", type=count(1), default=2, help="consumers in this process")
    ap.add_argument("--state-dir", default=None, help="default: a new temporary directory")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    run = uuid.uuid4().hex[:6]  # fresh names per run: the demo can be repeated on one broker
    sentences, output = f"sentences-{run}", f"word-counts-{run}"
    topology = word_count_topology(f"word-count-{run}", sentences, output)
    words = next(iter(topology.repartition_topics))
    app = App(
        topology,
        {0: lambda: Split(words), 1: lambda: Count(output)},
        bootstrap_servers=args.bootstrap,
        state_dir=Path(args.state_dir or tempfile.mkdtemp(prefix="word-count-")),
        threads=args.threads,
    )  # before any topic exists: a missing extra fails here, naming it
    try:
        await create_topics(args.bootstrap, {sentences: 4, output: 4})
    except BaseException:
        await app.stop()  # never started: this releases its state directory
        raise

    await app.start()
    expected: dict[str, int] = {}
    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, linger_ms=10)
    await producer.start()
    try:
        for i in range(args.sentences):
            sentence = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(1 + i % 7))
            for word in sentence.split():
                expected[word] = expected.get(word, 0) + 1
            await producer.send(sentences, sentence.encode(), key=b"%d" % i)
        await producer.flush()
    finally:
        await producer.stop()

    # Read the running counts until every word shows its final count.
    latest: dict[str, int] = {}
    consumer = AIOKafkaConsumer(
        output, bootstrap_servers=args.bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    try:
        while latest != expected and loop.time() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for r in records:
                    latest[r.key.decode()] = max(latest.get(r.key.decode(), 0), int(r.value))
    finally:
        await consumer.stop()
        await app.stop()  # raises nothing: a failed step is kept in app.failure
    if app.failure is not None:
        print(f"error: the application failed: {app.failure!r}", file=sys.stderr)
        return 1
    for word, seen in sorted(latest.items(), key=lambda kv: -kv[1]):
        print(f"{word:>8} {seen}")
    print("counts match the sentences produced:", latest == expected)
    return 0 if latest == expected else 1


if __name__ == "__main__":
    run(main)
