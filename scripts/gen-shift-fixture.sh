#!/usr/bin/env bash
# Regenerates tests/fixtures/shift/smollm2.json: llama.cpp's greedy text on smollm2-135m with
# a 256-token context and `--context-shift --keep 4` (two shifts in 400 tokens), which
# tests/session_context.rs compares with a kiln session shifting its context; and
# tests/fixtures/shift/smollm2_ctk_q8_0.json, the same run with a q8_0 K cache (`-ctk q8_0
# -fa on`: its shifts re-rotate quantized keys), which tests/kv_types.rs compares.
#
#   scripts/gen-shift-fixture.sh [LLAMA_BIN_DIR] [MODEL.gguf]
set -euo pipefail
bin=${1:-${KILN_HOME:-$HOME/.cache/kiln}/peer-full/build/bin}
model=${2:-$HOME/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf}
dir=$(dirname "$0")/../tests/fixtures/shift
mkdir -p "$dir"
prompt=$'A numbered list of countries and their capitals:\n1.'
version=$("$bin/llama-completion" --version 2>&1 | grep -m1 version || true)
for variant in f16 q8_0; do
    args=(-c 256 -n 400 --keep 4 --context-shift --temp 0 --ignore-eos -t 2 --no-repack -no-cnv)
    out=$dir/smollm2.json
    if [[ $variant != f16 ]]; then
        args+=(-ctk "$variant" -fa on)
        out=$dir/smollm2_ctk_$variant.json
    fi
    text=$("$bin/llama-completion" -m "$model" -p "$prompt" "${args[@]}" 2>/dev/null)
    python3 - "$out" "$prompt" "$text" "$version" "llama-completion -m $(basename "$model") -p PROMPT ${args[*]}" <<'PY'
import json, sys
out, prompt, text, version, cmd = sys.argv[1:]
assert text.startswith(prompt), "llama-completion echoes the prompt first"
doc = {"model": "smollm2-135m", "command": cmd, "llama_cpp": version, "prompt": prompt,
       "n_ctx": 256, "n_keep": 4, "n_predict": 400, "completion": text[len(prompt):]}
json.dump(doc, open(out, "w"), indent=1)
print(f"wrote {out}")
PY
done
