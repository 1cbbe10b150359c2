"""complete/chat against `kiln run --json` on the same model and prompt, streaming, and
log-probabilities."""

import pytest

import kiln
from conftest import MODEL, cli_json

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_complete_is_kiln_run_raw(engine, prompt):
    want = cli_json("run", "-m", MODEL, "-c", "1024", "--raw", "--temp", "0", "-n", "32", "-p", prompt)
    got = engine.complete(prompt, max_tokens=32, temperature=0)
    assert got.prompt_ids == want["prompt_ids"]
    assert got.ids == want["ids"]
    assert got.text == want["text"]
    assert got.finish_reason == want["finish_reason"] == "length"
    assert str(got) == got.text
    assert got.timings.gen_n == 32 and got.timings.prompt_n == len(want["prompt_ids"])


def test_token_prompt_is_text_prompt(engine):
    ids = engine.tokenize(PROMPTS[0])
    assert engine.complete(ids, max_tokens=8, temperature=0).ids == engine.complete(
        PROMPTS[0], max_tokens=8, temperature=0
    ).ids


@pytest.mark.parametrize("system", [None, "You are a pirate. Answer in one sentence."])
def test_chat_is_kiln_run(engine, system):
    user = "What is the tallest mountain on Earth?"
    args = ["run", "-m", MODEL, "-c", "1024", "--temp", "0", "-n", "48", "-p", user]
    messages = [{"role": "user", "content": user}]
    if system:
        args += ["--system", system]
        messages.insert(0, {"role": "system", "content": system})
    want = cli_json(*args)
    got = engine.chat(messages, max_tokens=48, temperature=0)
    assert got.prompt_ids == want["prompt_ids"]
    assert got.ids == want["ids"]
    assert got.text == want["text"]
    assert got.finish_reason == want["finish_reason"]


def test_chat_content_parts_are_joined(engine):
    parts = [{"type": "text", "text": "Say "}, {"type": "text", "text": "hello."}]
    a = engine.chat([{"role": "user", "content": parts}], max_tokens=4, temperature=0)
    b = engine.chat([{"role": "user", "content": "Say hello."}], max_tokens=4, temperature=0)
    assert a.prompt_ids == b.prompt_ids and a.ids == b.ids


def test_chat_runs_to_end_of_generation(engine):
    r = engine.chat([{"role": "user", "content": "Reply with the single word: yes"}], temperature=0)
    assert r.finish_reason == "eog" and r.text.strip()
    assert engine.detokenize(r.ids) == r.text


@pytest.mark.parametrize("kind", ["complete", "chat"])
def test_stream_concatenates_to_the_text(engine, kind):
    kw = dict(max_tokens=40, temperature=0.7, seed=42)
    if kind == "complete":
        whole = engine.complete(PROMPTS[2], **kw)
        stream = engine.complete(PROMPTS[2], stream=True, **kw)
    else:
        msgs = [{"role": "user", "content": "Write a haiku about rain."}]
        whole = engine.chat(msgs, **kw)
        stream = engine.chat(msgs, stream=True, **kw)
    assert isinstance(stream, kiln.Stream) and stream.result is None
    pieces = list(stream)
    assert all(isinstance(p, kiln.Piece) for p in pieces)
    assert "".join(p.text for p in pieces) == whole.text
    assert [p.id for p in pieces if p.id is not None] == whole.ids[: len(pieces)]
    assert stream.result.text == whole.text and stream.result.ids == whole.ids


def test_stop_string_holds_back_text(engine):
    full = engine.complete(PROMPTS[0], max_tokens=16, temperature=0).text
    stop = full[8:12]
    cut = engine.complete(PROMPTS[0], max_tokens=16, temperature=0, stop=[stop])
    assert cut.finish_reason == "stop" and cut.text == full[: full.index(stop)]
    pieces = list(engine.complete(PROMPTS[0], max_tokens=16, temperature=0, stop=stop, stream=True))
    assert "".join(p.text for p in pieces) == cut.text
    # A partial stop string at the end is released without a token of its own.
    tail = engine.complete(PROMPTS[0], max_tokens=3, temperature=0, stop=full[:6] + "\x00")
    pieces = list(engine.complete(PROMPTS[0], max_tokens=3, temperature=0, stop=full[:6] + "\x00", stream=True))
    assert "".join(p.text for p in pieces) == tail.text == engine.detokenize(tail.ids)
    assert sum(p.id is not None for p in pieces) == 3


def test_seeded_sampling_repeats(engine):
    kw = dict(max_tokens=24, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    a, b = engine.complete(PROMPTS[1], **kw), engine.complete(PROMPTS[1], **kw)
    assert a.ids == b.ids
    assert engine.complete(PROMPTS[1], **{**kw, "seed": 8}).ids != a.ids


def test_logprobs(engine):
    r = engine.complete(PROMPTS[0], max_tokens=6, temperature=0, logprobs=3)
    assert len(r.logprobs) == len(r.top_logprobs) == 6
    for id, lp, top in zip(r.ids, r.logprobs, r.top_logprobs):
        assert len(top) == 3 and top[0][0] == id and top[0][1] == pytest.approx(lp)
        assert lp <= 0 and top[0][1] >= top[1][1] >= top[2][1]
    pieces = list(engine.complete(PROMPTS[0], max_tokens=6, temperature=0, logprobs=True, stream=True))
    assert [p.logprob for p in pieces] == pytest.approx(r.logprobs)
    assert engine.complete(PROMPTS[0], max_tokens=2, temperature=0).logprobs is None


def test_logit_bias_and_penalties(engine):
    first = engine.complete(PROMPTS[0], max_tokens=1, temperature=0).ids[0]
    for key in (first, str(first)):
        banned = engine.complete(PROMPTS[0], max_tokens=1, temperature=0, logit_bias={key: float("-inf")})
        assert banned.ids[0] != first
    r = engine.complete(PROMPTS[0], max_tokens=8, temperature=0, repeat_penalty=1.3, presence_penalty=0.5)
    assert len(r.ids) == 8


def test_ignore_eos_and_max_tokens_zero(engine):
    r = engine.chat([{"role": "user", "content": "Say yes."}], max_tokens=64, temperature=0, ignore_eos=True)
    assert r.finish_reason == "length" and len(r.ids) == 64
    assert engine.complete("Hi", max_tokens=0).ids == []


def test_tokenize_roundtrip(engine):
    text = "Hello, world! <|im_start|> ünïcödé 🙂"
    ids = engine.tokenize(text)
    assert ids == cli_tokenize(text)
    assert engine.detokenize(ids) == text.replace("<|im_start|>", "")
    assert engine.detokenize(ids, special=True) == text
    assert engine.tokenize(text, parse_special=False) != ids


def cli_tokenize(text):
    import json
    import subprocess

    from conftest import kiln_bin

    out = subprocess.run([str(kiln_bin()), "tokenize", "-m", MODEL, "-p", text], capture_output=True, text=True)
    return json.loads(out.stdout)


def test_engine_properties(engine):
    assert engine.n_ctx == 1024 and engine.n_vocab == 49152 and engine.n_embd == 576
    assert engine.path.endswith(".gguf") and "cpu" in engine.backend.lower()
    assert "im_start" in engine.chat_template
