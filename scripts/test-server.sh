#!/usr/bin/env bash
# The official `openai` Python client against a real `kiln serve` on smollm2
# (tests/server/test_openai.py). Makes a venv with `openai` from PyPI on first use (outside
# the repo, under $KILN_HOME), builds the release binary, runs the tests. About a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${KILN_HOME:-$HOME/.cache/kiln}/venv-openai"
if ! "$venv/bin/python" -c "import openai" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade openai
fi
cargo build --release -p kiln-cli
target/release/kiln pull smollm2-135m >/dev/null
exec "$venv/bin/python" -W ignore::ResourceWarning -m unittest -v tests/server/test_openai.py "$@"
