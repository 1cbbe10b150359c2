#!/usr/bin/env python3
"""Generate kiln's dequantization fixtures with the `gguf` Python package (gguf-py).

    pip install gguf numpy
    python3 scripts/gen-quant-fixtures.py [--models-dir ~/.cache/kiln/models] \
        [--llama-cpp .../llama_cpp_python-0.3.36/vendor/llama.cpp]   # needs gcc

Writes into tests/fixtures/quant/:

* random/<TYPE>.q and random/<TYPE>.f32 -- random *valid* blocks of each type (random
  bytes, with the f16 scale fields replaced by finite values of realistic magnitude) and
  what `gguf.quants.dequantize` makes of them (little-endian f32).
* manifest.json -- the gguf/numpy versions used, the element count per random fixture,
  the types gguf-py cannot dequantize, and for real model tensors (when the models are
  cached) the sha256 of the tensor's bytes and of gguf-py's f32 output plus the first
  values, so the Rust test can check whole tensors without storing them.

* quantize/input.f32, quantize/input2.f32 -- two 2048-element rows (ggml's test vector
  0.1 + 2 cos(i), then noisy data with outliers and an all-zero block);
  quantize/<TYPE>.q -- what the reference quantizer (`quantize_row_*_ref`) makes of input;
  activation/<TYPE>.q -- what ggml's x86 CPU backend makes of input2 before a matmul
  (its AVX2 `quantize_row_q8_0`/`q8_1`, `quantize_row_q8_K`); and in manifest.json the
  bits of ggml's generic (scalar) vec_dot of each weight row with its activation row.
  gguf-py quantizes only the legacy and float types, so the rest of this section needs
  the llama.cpp sources (the llama-cpp-python 0.3.36 sdist, --llama-cpp) and gcc: the
  script compiles ggml-quants.c and ggml-cpu's quants.c into a scratch library and calls
  them through ctypes (without -mfma for the generic dot products, so no contraction).

Deterministic: the random blocks come from a fixed seed.
"""

import argparse
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile

import ctypes

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


N_QUANT = 2048

# Weight type -> (activation type, ggml generic vec_dot name or None for the float dots).
DOTS = {
    "F32": ("F32", None),
    "F16": ("F16", None),
    "BF16": ("BF16", None),
    "Q4_0": ("Q8_0", "q4_0_q8_0"),
    "Q4_1": ("Q8_1", "q4_1_q8_1"),
    "Q5_0": ("Q8_0", "q5_0_q8_0"),
    "Q5_1": ("Q8_1", "q5_1_q8_1"),
    "Q8_0": ("Q8_0", "q8_0_q8_0"),
    "Q2_K": ("Q8_K", "q2_K_q8_K"),
    "Q3_K": ("Q8_K", "q3_K_q8_K"),
    "Q4_K": ("Q8_K", "q4_K_q8_K"),
    "Q5_K": ("Q8_K", "q5_K_q8_K"),
    "Q6_K": ("Q8_K", "q6_K_q8_K"),
    "IQ4_NL": ("Q8_0", "iq4_nl_q8_0"),
    "IQ4_XS": ("Q8_K", "iq4_xs_q8_K"),
}

# What ggml's stripped-down build needs from the rest of ggml (written here, not copied).
STUBS_C = r"""
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
void ggml_abort(const char *file, int line, const char *fmt, ...) { fprintf(stderr, "abort %s:%d\n", file, line); abort(); }
size_t ggml_row_size(int type, long long ne) { (void)type; (void)ne; abort(); }
const char *ggml_type_name(int type) { (void)type; return "?"; }
size_t ggml_type_size(int type) { (void)type; abort(); }
float ggml_table_f32_f16[1 << 16];
float ggml_table_f32_e8m0_half[1 << 8];
float ggml_table_f32_ue4m3[1 << 8];
__attribute__((constructor, target("f16c"))) static void init_tables(void) {
    for (int i = 0; i < (1 << 16); i++) ggml_table_f32_f16[i] = _cvtsh_ss((unsigned short)i);
}
"""


def build_ggml(llama_cpp, tmp):
    """Compiles the ggml quantization sources into one shared library; None if impossible."""
    g = os.path.join(llama_cpp, "ggml")
    if not os.path.isfile(os.path.join(g, "src", "ggml-quants.c")):
        print(f"note: no llama.cpp sources at {llama_cpp}; skipping the ggml C oracle", file=sys.stderr)
        return None
    inc = [f"-I{g}/include", f"-I{g}/src", f"-I{g}/src/ggml-cpu"]
    with open(os.path.join(tmp, "stubs.c"), "w") as f:
        f.write(STUBS_C)
    objs = []
    # Generic code without -mfma so nothing is contracted; the x86 quantizers as built for AVX2.
    for src, flags in [
        (f"{g}/src/ggml-quants.c", []),
        (f"{g}/src/ggml-cpu/quants.c", []),
        (f"{g}/src/ggml-cpu/arch/x86/quants.c", ["-mavx2", "-mf16c", "-mfma"]),
        (os.path.join(tmp, "stubs.c"), []),
    ]:
        obj = os.path.join(tmp, f"o{len(objs)}.o")
        subprocess.run(["gcc", "-O2", "-fPIC", "-c", *flags, *inc, "-o", obj, src], check=True)
        objs.append(obj)
    lib = os.path.join(tmp, "libggmlq.so")
    subprocess.run(["gcc", "-shared", "-o", lib, *objs, "-lm"], check=True)
    return ctypes.CDLL(lib)


def quant_inputs():
    i = np.arange(N_QUANT, dtype=np.float32)
    x1 = (0.1 + 2.0 * np.cos(i)).astype(np.float32)
    rng = np.random.default_rng(7)
    x2 = (rng.standard_normal(N_QUANT) * 0.05).astype(np.float32)
    x2[rng.integers(0, N_QUANT, 20)] *= 40  # outliers
    x2[256:288] = 0  # an all-zero block
    return x1, x2


def ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def c_quantize(lib, fn, name, x):
    block, size = GGML_QUANT_SIZES[T[name]]
    if name == "Q8_1":
        size = 36  # gguf-py's table still says 40 (f32 d and s); ggml's block_q8_1 is 2 + 2 + 32
    out = np.zeros(N_QUANT // block * size, dtype=np.uint8)
    getattr(lib, fn)(ptr(x), ptr(out), ctypes.c_int64(x.size))
    return out


def float_dot(name, w, a):
    conv = {"F32": lambda b: b.view("<f4"), "F16": lambda b: b.view("<f2").astype(np.float32),
            "BF16": lambda b: (b.view("<u2").astype(np.uint32) << 16).view(np.float32)}[name]
    s = 0.0
    for p in (conv(w) * conv(a)).astype(np.float32):
        s += float(p)
    return float(np.float32(s))


def gen_quantize(manifest, llama_cpp, allow_no_ggml):
    for sub in ("quantize", "activation"):
        os.makedirs(os.path.join(OUT, sub), exist_ok=True)
    x1, x2 = quant_inputs()
    x = np.concatenate([x1[: N_QUANT // 2], x2[N_QUANT // 2 :]])
    y = np.concatenate([x2[: N_QUANT // 2], x1[N_QUANT // 2 :] * 3])
    x.astype("<f4").tofile(os.path.join(OUT, "quantize", "input.f32"))
    y.astype("<f4").tofile(os.path.join(OUT, "quantize", "input2.f32"))
    oracle = {}
    weights, acts = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        lib = build_ggml(llama_cpp, tmp) if llama_cpp else None
        if lib is None and not allow_no_ggml:
            sys.exit("error: the ggml C oracle is needed for the k-quant/IQ4 quantizer, activation and "
                     "vec_dot fixtures; pass --llama-cpp DIR, or --no-ggml to write only gguf-py's part")
        for name in KILN_TYPES:
            q = None
            if name in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
                q = np.asarray(quants.quantize(x, T[name])).view(np.uint8).reshape(-1)
                oracle[name] = f"gguf {manifest['gguf_version']}"
                if lib is not None and name.startswith("Q"):
                    c = c_quantize(lib, f"quantize_row_{name.lower()}_ref", name, x)
                    assert np.array_equal(c, q), f"gguf-py and ggml disagree on {name}"
                    oracle[name] += " + ggml"
            elif lib is not None:
                fn = "quantize_row_" + name.lower().replace("_k", "_K") + "_ref"
                q = c_quantize(lib, fn, name, x)
                oracle[name] = "ggml " + fn
            if q is not None:
                q.tofile(os.path.join(OUT, "quantize", f"{name}.q"))
                weights[name] = q
        for name in ("F32", "F16", "BF16"):
            acts[name] = np.asarray(quants.quantize(y, T[name])).view(np.uint8).reshape(-1)
        if lib is not None:
            for name, fn in (("Q8_0", "quantize_row_q8_0"), ("Q8_1", "quantize_row_q8_1"), ("Q8_K", "quantize_row_q8_K")):
                acts[name] = c_quantize(lib, fn, name, y)
        for name, a in acts.items():
            a.tofile(os.path.join(OUT, "activation", f"{name}.q"))
        dots = {}
        for name, (act, fn) in DOTS.items():
            if name not in weights or act not in acts:
                continue
            w, a = weights[name], acts[act]
            if fn is None:
                dots[name] = int(np.float32(float_dot(name, w, a)).view(np.uint32))
            elif lib is not None:
                s = np.zeros(1, dtype=np.float32)
                getattr(lib, f"ggml_vec_dot_{fn}_generic")(
                    ctypes.c_int(N_QUANT), ptr(s), ctypes.c_size_t(0), ptr(w), ctypes.c_size_t(0),
                    ptr(a), ctypes.c_size_t(0), ctypes.c_int(1))
                dots[name] = int(s.view(np.uint32)[0])
    manifest["quantize"] = {"n": N_QUANT, "oracle": oracle, "activations": sorted(acts), "vec_dot_bits": dots}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    home = os.environ.get("KILN_HOME", os.path.expanduser("~/.cache/kiln"))
    ap.add_argument("--models-dir", default=os.path.join(home, "models"))
    ap.add_argument(
        "--llama-cpp",
        default=os.path.join(home, "src", "llama_cpp_python-0.3.36", "vendor", "llama.cpp"),
        help="llama.cpp source tree (vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist)",
    )
    ap.add_argument("--no-ggml", action="store_true", help="skip the ggml C oracle (fewer fixtures)")
    args = ap.parse_args()
    manifest = {
        "generator": "scripts/gen-quant-fixtures.py",
        "gguf_version": importlib.metadata.version("gguf"),
        "numpy_version": importlib.metadata.version("numpy"),
    }
    gen_random(manifest)
    gen_quantize(manifest, args.llama_cpp if not args.no_ggml else "", args.no_ggml)
    gen_models(manifest, args.models_dir)
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {len(manifest['random'])} random types, gguf-py cannot do {manifest['gguf_unsupported']}")


if __name__ == "__main__":
    main()
