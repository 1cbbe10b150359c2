#!/usr/bin/env python3
"""Regenerate tests/fixtures/chat/run_prompt_ids.json: for each real model with a chat
template, the jinja2 render of its own template (from tests/fixtures/chat/expected.json,
made by scripts/gen-chat-fixtures.py) tokenized by llama.cpp's llama-tokenize, special
tokens parsed, BOS as docs/cli.md says (added iff add_bos and the text does not start with it).
tests/cli_run_prompt.rs checks that `kiln run --json` evaluates exactly these ids.

Usage: scripts/gen-run-prompt-fixture.py [LLAMA_BIN_DIR] [MODELS_DIR]
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAT = os.path.join(ROOT, "tests", "fixtures", "chat")
KILN_HOME = os.environ.get("KILN_HOME") or os.path.expanduser("~/.cache/kiln")
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(KILN_HOME, "peer-full", "build", "bin")
MODELS = sys.argv[2] if len(sys.argv) > 2 else os.path.expanduser("~/.cache/kiln/models")
# Catalog name -> GGUF stem, for the real models whose templates the chat fixtures hold.
MODELS_WITH_TEMPLATES = {
    "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1",
    "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m",
    "qwen2.5-coder-1.5b": "qwen2.5-coder-1.5b-instruct-q4_k_m",
}
CASES = ["user", "system_user"]


def tokenize(model, text, bos):
    args = [os.path.join(BIN, "llama-tokenize"), "-m", model, "--stdin", "--ids", "--log-disable"]
    if not bos:
        args.append("--no-bos")
    out = subprocess.run(args, input=text.encode(), capture_output=True, check=True).stdout.decode()
    return json.loads(out.strip().splitlines()[-1])


def main():
    expected = json.load(open(os.path.join(CHAT, "expected.json")))
    cases = json.load(open(os.path.join(CHAT, "cases.json")))["cases"]
    version = subprocess.run([os.path.join(BIN, "llama-tokenize"), "--version"], capture_output=True, text=True)
    out = {"generator": "scripts/gen-run-prompt-fixture.py",
           "llama_cpp": (version.stdout + version.stderr).strip().splitlines()[0]
           + " (llama-cpp-python 0.3.36 sdist)", "models": {}}
    for name, stem in MODELS_WITH_TEMPLATES.items():
        path = os.path.join(MODELS, stem + ".gguf")
        entry = expected.get("gguf-" + stem)
        if entry is None or not os.path.exists(path):
            print(f"skipping {name}: no render or no model file", file=sys.stderr)
            continue
        rows = []
        for case in CASES:
            msgs = cases[case]["messages"]
            text = entry["renders"][case]["ok"]
            plain = tokenize(path, text, False)
            with_bos = tokenize(path, text, True)
            # llama-tokenize adds BOS whenever add_bos; docs/cli.md never doubles one.
            ids = with_bos if len(with_bos) > len(plain) and with_bos[1:] == plain and plain[:1] != with_bos[:1] else plain
            system = next((m["content"] for m in msgs if m["role"] == "system"), None)
            user = next(m["content"] for m in msgs if m["role"] == "user")
            rows.append({"case": case, "system": system, "prompt": user, "rendered": text, "ids": ids})
        out["models"][name] = rows
    path = os.path.join(CHAT, "run_prompt_ids.json")
    json.dump(out, open(path, "w"), indent=1, ensure_ascii=False)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
