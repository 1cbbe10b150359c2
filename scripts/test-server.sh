#!/usr/bin/env bash
# The official `openai` Python client against a real `kiln serve`: smollm2
# (tests/server/test_openai.py), and qwen2.5-coder-0.5b and smollm2 for tool calling and
# structured output (tests/server/test_tools.py), and images as data URLs with a synthetic
# SmolVLM-family mmproj (tests/server/test_images.py), and the encoder nomic-embed-text-v1.5 for
# embeddings and rerank errors (tests/server/test_encoders.py). Makes a venv with `openai` and
# `jsonschema` from PyPI on first use (outside the repo, under $KILN_HOME), builds the release
# binary, runs the tests. A few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${KILN_HOME:-$HOME/.cache/kiln}/venv-openai"
if ! "$venv/bin/python" -c "import openai, jsonschema" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade openai jsonschema
fi
cargo build --release -p kiln-cli
cargo build --release -q -p kiln --example synth
smollm2=$(target/release/kiln pull smollm2-135m)
target/release/kiln pull qwen2.5-coder-0.5b >/dev/null
target/release/kiln pull nomic-embed-text-v1.5 >/dev/null
KILN_VISION_DIR=$(mktemp -d)
export KILN_VISION_DIR
trap 'rm -rf "$KILN_VISION_DIR"' EXIT
target/release/examples/synth smollm2-image-tokens:"$smollm2" "$KILN_VISION_DIR/lm.gguf"
target/release/examples/synth idefics3-tiny-mmproj "$KILN_VISION_DIR/mmproj.gguf"
"$venv/bin/python" -W ignore::ResourceWarning -m unittest -v tests/server/test_openai.py tests/server/test_tools.py \
    tests/server/test_images.py tests/server/test_encoders.py "$@"
