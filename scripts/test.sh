#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs the package with its dev extra, then runs
# ruff, mypy --strict and pytest. The README's test command; .ci/run calls it too.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
"$PYTHON" -m pip install --quiet --disable-pip-version-check -e '.[dev]'
# Apache Kafka 4.x for the integration tests, assembled from Maven Central (cached after once).
"$PYTHON" scripts/kafka.py install

echo "== ruff"
"$PYTHON" -m ruff check .
"$PYTHON" -m ruff format --check .
echo "== mypy --strict"
"$PYTHON" -m mypy
echo "== pytest"
"$PYTHON" -m pytest "$@"
