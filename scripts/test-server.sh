#!/usr/bin/env bash
# The official `openai` Python client against a real `kiln serve`: smollm2
# (tests/server/test_openai.py), and qwen2.5-coder-0.5b and smollm2 for tool calling and
# structured output (tests/server/test_tools.py). Makes a venv with `openai` and `jsonschema`
# from PyPI on first use (outside the repo, under $KILN_HOME), builds the release binary, runs
# the tests. A few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${KILN_HOME:-$HOME/.cache/kiln}/venv-openai"
if ! "$venv/bin/python" -c "import openai, jsonschema" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade openai jsonschema
fi
cargo build --release -p kiln-cli
target/release/kiln pull smollm2-135m >/dev/null
target/release/kiln pull qwen2.5-coder-0.5b >/dev/null
exec "$venv/bin/python" -W ignore::ResourceWarning -m unittest -v tests/server/test_openai.py tests/server/test_tools.py "$@"
