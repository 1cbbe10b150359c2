#!/usr/bin/env bash
# The Python package (bindings/python) built and installed with pip into a venv, then its
# pytest suite (bindings/python/tests), which compares it with the `kiln` binary on smollm2.
# The venv lives under $KILN_HOME (made on first use, with maturin, pytest and NumPy from
# PyPI); the build reuses the workspace's target/, so only the bindings crate compiles.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${KILN_HOME:-$HOME/.cache/kiln}/venv-python"
if ! "$venv/bin/python" -c "import maturin, pytest, numpy" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade "maturin>=1.9.4,<2" pytest numpy
fi
cargo build --release -p kiln-cli
target/release/kiln pull smollm2-135m >/dev/null
# No build isolation: the venv's maturin builds (nothing is fetched per run).
PATH="$venv/bin:$PATH" "$venv/bin/pip" install --quiet --no-build-isolation --force-reinstall --no-deps ./bindings/python
cd bindings/python
exec "$venv/bin/python" -m pytest -q tests "$@"
