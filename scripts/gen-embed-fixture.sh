#!/usr/bin/env bash
# Regenerates tests/fixtures/embed/smollm2-mean.json: llama.cpp's mean-pooled, unnormalized
# embeddings of a few texts on smollm2-135m, which tests/embed_oracle.rs compares with kiln.
#
#   scripts/gen-embed-fixture.sh [LLAMA_BIN_DIR] [MODEL.gguf]
#
# --no-repack: this llama.cpp build (GGML_NATIVE) picks an AMX repacked kernel that dies
# with SIGILL on CPUs without AMX; the plain q4_1 x q8_1 path is what kiln mirrors anyway.
set -euo pipefail
bin=${1:-${KILN_HOME:-$HOME/.cache/kiln}/peer-full/build/bin}
model=${2:-$HOME/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=$(dirname "$0")/../tests/fixtures/embed/smollm2-mean.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
texts=("Hello world" "The quick brown fox jumps over the lazy dog." "Embeddings map text to vectors; similar texts land close together.")
cmd=(llama-embedding -m "$(basename "$model")" --pooling mean --embd-normalize -1 --embd-output-format json -t 2 --no-repack -p TEXT)
for i in "${!texts[@]}"; do
  "$bin/llama-embedding" -m "$model" -p "${texts[$i]}" --pooling mean --embd-normalize -1 \
    --embd-output-format json -t 2 --no-repack >"$tmp/$i.json" 2>"$tmp/$i.log"
done
version=$("$bin/llama-embedding" --version 2>&1 | grep -m1 version || true)
python3 - "$tmp" "$out" "$version" "${cmd[*]}" "${texts[@]}" <<'PY'
import json, sys
tmp, out, version, cmd, texts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
cases = []
for i, t in enumerate(texts):
    d = json.load(open(f"{tmp}/{i}.json"))
    cases.append({"text": t, "embedding": d["data"][0]["embedding"]})
doc = {"model": "smollm2-135m", "command": cmd,
       "llama_cpp": version + " (llama-cpp-python 0.3.36 sdist, vendor/llama.cpp 0c1e57098)",
       "cases": cases}
json.dump(doc, open(out, "w"), indent=1)
print(f"wrote {out}: {len(cases)} cases")
PY
