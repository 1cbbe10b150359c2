"""Shared fixtures: one smollm2 engine for the whole run, and the `kiln` binary (built by
`cargo build --release`) that the bindings' results are compared with."""

import json
import os
import subprocess
from pathlib import Path

import pytest

import kiln

MODEL = "smollm2-135m"
ROOT = Path(__file__).resolve().parents[3]


def kiln_bin() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    path = target / "release" / "kiln"
    if not path.exists():
        pytest.fail(f"{path} is missing: run `cargo build --release -p kiln-cli` first")
    return path


def cli_json(*args: str) -> dict:
    """Runs `kiln ARGS --json` and returns its JSON output."""
    out = subprocess.run(
        [str(kiln_bin()), *args, "--json"], check=True, capture_output=True, text=True, timeout=300
    )
    return json.loads(out.stdout)


@pytest.fixture(scope="session")
def engine() -> kiln.Engine:
    return kiln.Engine(MODEL, n_ctx=1024, n_seq=2)
