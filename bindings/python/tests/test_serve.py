"""kiln.serve: the OpenAI-compatible server in this process."""

import json
import urllib.request

import pytest

import kiln
from conftest import MODEL


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def test_serve_in_process(engine):
    with kiln.serve(MODEL, port=0, n_ctx=1024, parallel=2, block=False) as server:
        assert server.url == f"http://127.0.0.1:{server.port}" and server.port > 0
        with urllib.request.urlopen(server.url + "/health", timeout=30) as r:
            assert json.loads(r.read()) == {"status": "ok"}
        body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}
        got = post(server.url + "/v1/completions", body)["choices"][0]["text"]
        assert got == engine.complete(body["prompt"], max_tokens=12, temperature=0).text
        msgs = [{"role": "user", "content": "Name a fruit."}]
        body = {"model": MODEL, "messages": msgs, "max_tokens": 12, "temperature": 0}
        got = post(server.url + "/v1/chat/completions", body)["choices"][0]["message"]["content"]
        assert got == engine.chat(msgs, max_tokens=12, temperature=0).text
    server.stop()  # a second stop does nothing


def test_serve_errors():
    with pytest.raises(kiln.KilnError, match="no such file"):
        kiln.serve("no-such-model.gguf", port=0, block=False)
    with pytest.raises(kiln.InvalidArgumentError):
        kiln.serve(MODEL, port=0, parallel=0, block=False)


def test_speculation(engine):
    """A draft model (here smollm2 drafting for itself) and prompt lookup leave greedy
    text unchanged, in the engine and in the server, whose usage counts the drafts."""
    prompt = "List the days of the week: Monday, Tuesday,"
    plain = engine.complete(prompt, max_tokens=16, temperature=0).text
    for spec in [{"draft_model": MODEL, "draft_max": 4}, {"lookup_ngram": 2}]:
        e = kiln.Engine(MODEL, n_ctx=512, **spec)
        assert e.complete(prompt, max_tokens=16, temperature=0).text == plain, spec
    with kiln.serve(MODEL, port=0, n_ctx=512, parallel=2, block=False, draft_model=MODEL, draft_max=4) as server:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 16, "temperature": 0}
        got = post(server.url + "/v1/completions", body)
        assert got["choices"][0]["text"] == plain
        assert got["usage"]["draft_tokens"] > 0 and got["usage"]["accepted_tokens"] > 0, got["usage"]
    with pytest.raises(kiln.KilnError, match="draft-min"):
        kiln.Engine(MODEL, draft_model=MODEL, draft_max=2, draft_min=3)
