#!/usr/bin/env python3
"""Regenerate tests/fixtures/chat/: chat templates and their jinja2 renders.

Renders every template of llama.cpp's models/templates/ (and the chat templates of the
cached real models) on a fixed set of message lists, the way Hugging Face transformers'
`apply_chat_template` does: an ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks and loopcontrols, its `tojson` override (json.dumps, ensure_ascii=False),
`raise_exception`, `strftime_now`, and `messages`, `tools` (None when absent), `documents`
(None), `add_generation_prompt`, `bos_token`, `eos_token` in the context.
`strftime_now` is pinned to FIXED_NOW so the renders are reproducible.

Usage: scripts/gen-chat-fixtures.py [LLAMA_CPP_DIR] [MODELS_DIR]
  LLAMA_CPP_DIR  default /tmp/dl/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp
  MODELS_DIR     default ~/.cache/kiln/models (needs `pip install gguf`)

Writes tests/fixtures/chat/{templates/*.jinja, cases.json, expected.json}.
expected.json: {template: {"bos_token", "eos_token", "renders": {case: {"ok": text} |
{"error": message}}}}.
"""

import datetime
import json
import os
import shutil
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "chat")
# 2025-03-14 15:09:26 UTC; kiln's test pins the same instant.
FIXED_NOW = datetime.datetime(2025, 3, 14, 15, 9, 26)
FIXED_NOW_UNIX = 1741964966
DEFAULT_BOS, DEFAULT_EOS = "<s>", "</s>"

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_temperature",
            "description": "Get the current temperature at a location.",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {
                        "type": "string",
                        "description": "The location, in the format \"City, Country\".",
                    },
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["location"],
            },
        },
    }
]
TOOL_CALL = {
    "id": "call12345",
    "type": "function",
    "function": {"name": "get_current_temperature", "arguments": {"location": "Paris, France", "unit": "celsius"}},
}
# OpenAI clients send arguments as a JSON string.
TOOL_CALL_STR = {
    "id": "call12345",
    "type": "function",
    "function": {"name": "get_current_temperature", "arguments": "{\"location\": \"Paris, France\"}"},
}
CASES = {
    "user": {"messages": [{"role": "user", "content": "Hello!"}], "add_generation_prompt": True},
    "system_user": {
        "messages": [SYSTEM, {"role": "user", "content": "What is the capital of France?"}],
        "add_generation_prompt": True,
    },
    "multi_turn": {
        "messages": [
            SYSTEM,
            {"role": "user", "content": "Hi there."},
            {"role": "assistant", "content": "Hello! How can I help you today?"},
            {"role": "user", "content": "  Tell me a joke.\n"},
        ],
        "add_generation_prompt": True,
    },
    "multi_turn_no_gen": {
        "messages": [
            {"role": "user", "content": "1 + 1 ="},
            {"role": "assistant", "content": "2"},
        ],
        "add_generation_prompt": False,
    },
    "unicode": {
        "messages": [{"role": "user", "content": "Héllo \"wörld\" <b>&amp;</b> 😀 — 日本語\nline two\ttab {{ x }}"}],
        "add_generation_prompt": True,
    },
    "tools": {
        "messages": [SYSTEM, {"role": "user", "content": "What's the temperature in Paris?"}],
        "add_generation_prompt": True,
        "tools": TOOLS,
    },
    "tool_calls": {
        "messages": [
            SYSTEM,
            {"role": "user", "content": "What's the temperature in Paris?"},
            {"role": "assistant", "tool_calls": [TOOL_CALL]},
            {"role": "tool", "tool_call_id": "call12345", "name": "get_current_temperature", "content": "22.0"},
        ],
        "add_generation_prompt": True,
        "tools": TOOLS,
    },
    "tool_calls_content": {
        "messages": [
            {"role": "user", "content": "Temperature in Paris, please."},
            {"role": "assistant", "content": "Let me check.", "tool_calls": [TOOL_CALL]},
            {"role": "tool", "tool_call_id": "call12345", "name": "get_current_temperature", "content": "22.0"},
            {"role": "assistant", "content": "It is 22 °C in Paris."},
        ],
        "add_generation_prompt": False,
        "tools": TOOLS,
    },
    "tool_calls_string_args": {
        "messages": [
            {"role": "user", "content": "Temperature in Paris, please."},
            {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL_STR]},
            {"role": "tool", "tool_call_id": "call12345", "name": "get_current_temperature", "content": "22.0"},
        ],
        "add_generation_prompt": True,
        "tools": TOOLS,
    },
}


class GenerationTag(jinja2.ext.Extension):
    """transformers' AssistantTracker: `{% generation %}...{% endgeneration %}` renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_all(source, bos, eos):
    env = make_env()
    try:
        tmpl = env.from_string(source)
    except Exception as e:  # a syntax error fails every case
        return {name: {"error": f"{type(e).__name__}: {e}"} for name in CASES}
    out = {}
    for name, case in CASES.items():
        try:
            text = tmpl.render(
                messages=case["messages"],
                tools=case.get("tools"),
                documents=None,
                add_generation_prompt=case["add_generation_prompt"],
                bos_token=bos,
                eos_token=eos,
            )
            out[name] = {"ok": text}
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    return out


def gguf_templates(models_dir):
    """(name, template, bos, eos) of each cached model that has a chat template."""
    try:
        import gguf
    except ImportError:
        print("note: gguf not installed; skipping the real models' templates", file=sys.stderr)
        return []
    found = []
    for fname in sorted(os.listdir(models_dir)) if os.path.isdir(models_dir) else []:
        if not fname.endswith(".gguf"):
            continue
        r = gguf.GGUFReader(os.path.join(models_dir, fname))
        f = r.fields.get("tokenizer.chat_template")
        if f is None:
            continue
        text = bytes(f.parts[f.data[0]]).decode("utf-8")
        toks = r.fields["tokenizer.ggml.tokens"]

        def token(key):
            fid = r.fields.get(key)
            if fid is None:
                return ""
            i = int(fid.parts[fid.data[0]][0])
            return bytes(toks.parts[toks.data[i]]).decode("utf-8")

        found.append((
            "gguf-" + fname[: -len(".gguf")],
            text,
            token("tokenizer.ggml.bos_token_id"),
            token("tokenizer.ggml.eos_token_id"),
        ))
    return found


def main():
    llama = sys.argv[1] if len(sys.argv) > 1 else "/tmp/dl/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp"
    models = sys.argv[2] if len(sys.argv) > 2 else os.path.expanduser("~/.cache/kiln/models")
    src_dir = os.path.join(llama, "models", "templates")
    tdir = os.path.join(OUT, "templates")
    if os.path.isdir(tdir):
        shutil.rmtree(tdir)
    os.makedirs(tdir)

    entries = []
    for fname in sorted(os.listdir(src_dir)):
        if fname.endswith(".jinja"):
            with open(os.path.join(src_dir, fname), encoding="utf-8") as fh:
                entries.append((fname[: -len(".jinja")], fh.read(), DEFAULT_BOS, DEFAULT_EOS))
    entries += gguf_templates(models)

    expected = {}
    n_ok = n_err = 0
    for name, text, bos, eos in entries:
        with open(os.path.join(tdir, name + ".jinja"), "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        renders = render_all(text, bos, eos)
        n_ok += sum("ok" in r for r in renders.values())
        n_err += sum("error" in r for r in renders.values())
        expected[name] = {"bos_token": bos, "eos_token": eos, "renders": renders}

    meta = {
        "generator": "scripts/gen-chat-fixtures.py",
        "jinja2": jinja2.__version__,
        "python": sys.version.split()[0],
        "source": src_dir,
        "fixed_now_unix": FIXED_NOW_UNIX,
    }
    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as fh:
        json.dump({"meta": meta, "cases": CASES}, fh, ensure_ascii=False, indent=1)
        fh.write("\n")
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as fh:
        json.dump(expected, fh, ensure_ascii=False, indent=1, sort_keys=True)
        fh.write("\n")
    print(f"{len(entries)} templates x {len(CASES)} cases: {n_ok} renders, {n_err} errors", file=sys.stderr)


if __name__ == "__main__":
    assert datetime.datetime.fromtimestamp(FIXED_NOW_UNIX, datetime.timezone.utc).replace(tzinfo=None) == FIXED_NOW
    main()
