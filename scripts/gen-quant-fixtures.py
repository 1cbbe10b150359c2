#!/usr/bin/env python3
"""Generate kiln's dequantization fixtures with the `gguf` Python package (gguf-py).

    pip install gguf numpy
    python3 scripts/gen-quant-fixtures.py [--models-dir ~/.cache/kiln/models]

Writes into tests/fixtures/quant/:

* random/<TYPE>.q and random/<TYPE>.f32 -- random *valid* blocks of each type (random
  bytes, with the f16 scale fields replaced by finite values of realistic magnitude) and
  what `gguf.quants.dequantize` makes of them (little-endian f32).
* manifest.json -- the gguf/numpy versions used, the element count per random fixture,
  the types gguf-py cannot dequantize, and for real model tensors (when the models are
  cached) the sha256 of the tensor's bytes and of gguf-py's f32 output plus the first
  values, so the Rust test can check whole tensors without storing them.

Deterministic: the random blocks come from a fixed seed.
"""

import argparse
import hashlib
import importlib.metadata
import json
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, quants
from gguf.constants import GGML_QUANT_SIZES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "quant")

# Every type kiln dequantizes, with the byte offsets of the f16 scale fields in a block.
KILN_TYPES = {
    "F32": [],
    "F16": [],
    "BF16": [],
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "Q8_1": [0, 2],
    "Q2_K": [80, 82],
    "Q3_K": [108],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
    "Q8_K": [],
    "IQ4_NL": [0],
    "IQ4_XS": [0],
}

# The cached real models (~/.cache/kiln/models) and how many tensors of each type to check.
MODELS = [
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma-3-270m-q4_k_m.gguf",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "tiny.gguf",
]
TENSORS_PER_TYPE = 2
FIRST_VALUES = 8


def realistic_f16(rng, n):
    """Finite f16 scales: magnitudes 1e-5..1e-1 (log-uniform), random sign, some zeros."""
    mag = 10.0 ** rng.uniform(-5, -1, size=n)
    sign = rng.choice([-1.0, 1.0], size=n)
    v = (mag * sign).astype(np.float16)
    v[rng.random(n) < 0.03] = 0
    return v


def random_blocks(rng, name, nblocks):
    ty = T[name]
    block, size = GGML_QUANT_SIZES[ty]
    n = block * nblocks
    if name == "F32":
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 4, n)).astype(np.float32)
        return x.view(np.uint8), n
    if name == "F16":
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
        bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF  # no inf/NaN: clear the top exponent bit
        return bits.view(np.uint8), n
    if name == "BF16":
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
        bits[(bits & 0x7F80) == 0x7F80] &= 0xBFFF
        return bits.view(np.uint8), n
    raw = rng.integers(0, 256, (nblocks, size), dtype=np.uint16).astype(np.uint8)
    for off in KILN_TYPES[name]:
        raw[:, off : off + 2] = realistic_f16(rng, nblocks).view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(-1), n


def gguf_dequantize(name, data):
    return np.ascontiguousarray(quants.dequantize(data, T[name]), dtype=np.float32).reshape(-1)


def gen_random(manifest):
    rng = np.random.default_rng(20250101)
    os.makedirs(os.path.join(OUT, "random"), exist_ok=True)
    manifest["random"] = {}
    manifest["gguf_unsupported"] = []
    for name in KILN_TYPES:
        block, _ = GGML_QUANT_SIZES[T[name]]
        nblocks = 8 if block == 32 else (4 if block == 256 else 256)
        data, n = random_blocks(rng, name, nblocks)
        try:
            out = gguf_dequantize(name, data)
        except NotImplementedError:
            manifest["gguf_unsupported"].append(name)
            continue
        assert out.size == n and np.all(np.isfinite(out)), name
        with open(os.path.join(OUT, "random", f"{name}.q"), "wb") as f:
            f.write(data.tobytes())
        with open(os.path.join(OUT, "random", f"{name}.f32"), "wb") as f:
            f.write(out.astype("<f4").tobytes())
        manifest["random"][name] = n


def gen_models(manifest, models_dir):
    manifest["models"] = {}
    for model in MODELS:
        path = os.path.join(models_dir, model)
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            print(f"note: {path} is not cached; skipping", file=sys.stderr)
            continue
        reader = GGUFReader(path)
        by_type = {}
        for t in sorted(reader.tensors, key=lambda t: (int(t.n_elements), t.name)):
            by_type.setdefault(t.tensor_type.name, []).append(t)
        entries = []
        for name, tensors in sorted(by_type.items()):
            if name not in KILN_TYPES:
                continue
            for t in tensors[:TENSORS_PER_TYPE]:
                raw = np.asarray(t.data).view(np.uint8).reshape(-1)
                out = gguf_dequantize(name, raw).astype("<f4")
                entries.append(
                    {
                        "tensor": t.name,
                        "type": name,
                        "n": int(t.n_elements),
                        "input_sha256": hashlib.sha256(raw.tobytes()).hexdigest(),
                        "sha256": hashlib.sha256(out.tobytes()).hexdigest(),
                        "first_bits": [int(v) for v in out[:FIRST_VALUES].view(np.uint32)],
                    }
                )
        manifest["models"][model] = entries


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    home = os.environ.get("KILN_HOME", os.path.expanduser("~/.cache/kiln"))
    ap.add_argument("--models-dir", default=os.path.join(home, "models"))
    args = ap.parse_args()
    manifest = {
        "generator": "scripts/gen-quant-fixtures.py",
        "gguf_version": importlib.metadata.version("gguf"),
        "numpy_version": importlib.metadata.version("numpy"),
    }
    gen_random(manifest)
    gen_models(manifest, args.models_dir)
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {len(manifest['random'])} random types, gguf-py cannot do {manifest['gguf_unsupported']}")


if __name__ == "__main__":
    main()
