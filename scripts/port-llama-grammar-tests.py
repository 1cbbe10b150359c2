#!/usr/bin/env python3
"""Ports llama.cpp's grammar test cases to data files under tests/fixtures/grammar/.

Reads, from a llama.cpp source tree (default: the one `kiln pull --llama-cpp-source`
unpacks):
  tests/test-grammar-integration.cpp   grammar/schema + strings that must pass / fail
  tests/test-json-schema-to-grammar.cpp  schemas llama.cpp converts (SUCCESS) or rejects
                                         (FAILURE), with the GBNF it writes for each
  grammars/*.gbnf                      the example grammars (copied as they are)

and writes
  tests/fixtures/grammar/integration.json
  tests/fixtures/grammar/json-schema-to-grammar.json
  tests/fixtures/grammar/gbnf/*.gbnf

A test string that contains tokens (llama.cpp's `token(N)`) is a list of segments: text
strings and {"token": N}.

usage: scripts/port-llama-grammar-tests.py [LLAMA_CPP_DIR]
"""

import json
import os
import re
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SRC = os.path.expanduser("~/.cache/kiln/src/llama_cpp_python-0.3.36/vendor/llama.cpp")
OUT = os.path.join(ROOT, "tests", "fixtures", "grammar")


class Tok:
    def __init__(self, kind, value):
        self.kind, self.value = kind, value

    def __repr__(self):
        return f"{self.kind}:{self.value!r}"


ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}


def lex(src):
    """C++ tokens: strings (regular and R"delim(...)delim"), identifiers, numbers, punctuation."""
    i, out = 0, []
    while i < len(src):
        c = src[i]
        if src.startswith("//", i):
            i = src.index("\n", i) if "\n" in src[i:] else len(src)
        elif src.startswith("/*", i):
            i = src.index("*/", i) + 2
        elif c.isspace():
            i += 1
        elif src.startswith('R"', i):
            j = src.index("(", i)
            delim = src[i + 2 : j]
            end = src.index(")" + delim + '"', j)
            out.append(Tok("str", src[j + 1 : end]))
            i = end + len(delim) + 2
        elif c == '"':
            i += 1
            s = []
            while src[i] != '"':
                if src[i] == "\\":
                    e = src[i + 1]
                    if e == "x":
                        m = re.match(r"[0-9a-fA-F]+", src[i + 2 :])
                        s.append(chr(int(m.group(0), 16)))
                        i += 2 + len(m.group(0))
                        continue
                    s.append(ESCAPES[e])
                    i += 2
                else:
                    s.append(src[i])
                    i += 1
            out.append(Tok("str", "".join(s)))
            i += 1
        elif c.isalpha() or c == "_":
            m = re.match(r"[A-Za-z_][A-Za-z0-9_:]*", src[i:])
            out.append(Tok("id", m.group(0)))
            i += len(m.group(0))
        elif c.isdigit():
            m = re.match(r"[0-9]+", src[i:])
            out.append(Tok("num", int(m.group(0))))
            i += len(m.group(0))
        else:
            out.append(Tok("p", c))
            i += 1
    return out


class Parser:
    def __init__(self, toks):
        self.t, self.i = toks, 0

    def peek(self, k=0):
        return self.t[self.i + k] if self.i + k < len(self.t) else Tok("eof", None)

    def next(self):
        tok = self.peek()
        self.i += 1
        return tok

    def expect(self, kind, value=None):
        tok = self.next()
        assert tok.kind == kind and (value is None or tok.value == value), f"expected {kind} {value}, got {tok}"
        return tok

    def expr(self):
        """A string expression (literals and token(N) joined by +), a {list}, or an identifier."""
        tok = self.peek()
        if tok.kind == "p" and tok.value == "{":
            self.next()
            items = []
            while not (self.peek().kind == "p" and self.peek().value == "}"):
                items.append(self.expr())
                if self.peek().kind == "p" and self.peek().value == ",":
                    self.next()
            self.next()
            return items
        segs = []
        while True:
            tok = self.next()
            if tok.kind == "str":
                segs.append(tok.value)
            elif tok.kind == "id" and tok.value == "token":
                self.expect("p", "(")
                segs.append({"token": self.expect("num").value})
                self.expect("p", ")")
            elif tok.kind == "id":
                return tok.value
            else:
                raise AssertionError(f"unexpected {tok}")
            if self.peek().kind == "p" and self.peek().value == "+":
                self.next()
                continue
            break
        # Merge adjacent text; a pure-text expression is a plain string.
        merged = []
        for s in segs:
            if isinstance(s, str) and merged and isinstance(merged[-1], str):
                merged[-1] += s
            else:
                merged.append(s)
        if all(isinstance(s, str) for s in merged):
            return "".join(merged)
        return merged

    def call_args(self):
        self.expect("p", "(")
        args = []
        while not (self.peek().kind == "p" and self.peek().value == ")"):
            args.append(self.expr())
            if self.peek().kind == "p" and self.peek().value == ",":
                self.next()
        self.next()
        return args


def functions(src):
    """Function bodies by name (top-level `static void name() { ... }`)."""
    out = {}
    for m in re.finditer(r"static void (\w+)\(\) \{", src):
        depth, i = 1, m.end()
        while depth:
            if src[i] == "{":
                depth += 1
            elif src[i] == "}":
                depth -= 1
            i += 1
        out[m.group(1)] = src[m.end() : i - 1]
    return out


def integration(src):
    cases = []
    bodies = functions(src)
    for fname, body in bodies.items():
        toks = lex(body)
        p = Parser(toks)
        while p.i < len(toks):
            tok = p.next()
            if tok.kind == "id" and tok.value in ("test_grammar", "test_schema") and p.peek().value == "(":
                name, grammar, passing, failing = p.call_args()
                cases.append({
                    "kind": "gbnf" if tok.value == "test_grammar" else "schema",
                    "group": fname,
                    "name": name,
                    "grammar": grammar,
                    "pass": passing,
                    "fail": failing,
                })
    # Grammars llama.cpp refuses to build, each with the reason its test names.
    refused = []
    for fname, reason in [
        ("test_failure_missing_root", "no root rule"),
        ("test_failure_missing_reference", "undefined rule"),
        ("test_failure_left_recursion", "left recursion"),
    ]:
        for tok in lex(bodies[fname]):
            if tok.kind == "str" and "::=" in tok.value:
                refused.append({"group": fname, "reason": reason, "grammar": tok.value})
    return {"cases": cases, "llama_cpp_refuses": refused}


def schema_to_grammar(src):
    body = src[src.index("static void test_all(") :]
    toks = lex(body)
    p = Parser(toks)
    cases = []
    while p.i < len(toks):
        tok = p.next()
        if tok.kind == "id" and tok.value == "test" and p.peek().value == "(" and p.peek(1).value == "{":
            p.expect("p", "(")
            status, name, schema, grammar = p.expr()
            cases.append({"status": status, "name": name, "schema": schema, "grammar": grammar})
    return {"cases": cases}


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_SRC
    os.makedirs(os.path.join(OUT, "gbnf"), exist_ok=True)
    note = f"ported from llama.cpp ({os.path.relpath(src, os.path.expanduser('~'))}) by scripts/port-llama-grammar-tests.py"
    with open(os.path.join(src, "tests", "test-grammar-integration.cpp")) as f:
        data = integration(f.read())
    with open(os.path.join(OUT, "integration.json"), "w") as f:
        json.dump({"source": note + ": tests/test-grammar-integration.cpp", **data}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(src, "tests", "test-json-schema-to-grammar.cpp")) as f:
        data2 = schema_to_grammar(f.read())
    with open(os.path.join(OUT, "json-schema-to-grammar.json"), "w") as f:
        json.dump({"source": note + ": tests/test-json-schema-to-grammar.cpp", **data2}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    gdir = os.path.join(src, "grammars")
    names = sorted(n for n in os.listdir(gdir) if n.endswith(".gbnf"))
    for n in names:
        shutil.copy(os.path.join(gdir, n), os.path.join(OUT, "gbnf", n))
    print(f"{len(data['cases'])} integration cases, {len(data['llama_cpp_refuses'])} refused grammars, "
          f"{len(data2['cases'])} schema conversions, {len(names)} grammar files")


if __name__ == "__main__":
    main()
