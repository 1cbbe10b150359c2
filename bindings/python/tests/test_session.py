"""Sessions: chat turns, history, save/restore, appends."""

import pytest

import kiln


def test_chat_turns_reuse_the_cache(engine):
    s = engine.session()
    s.append_chat([{"role": "user", "content": "Name a color."}])
    first = s.generate(max_tokens=12, temperature=0)
    assert [m["role"] for m in s.history] == ["user", "assistant"]
    assert s.history[1]["content"] == first.text
    before = s.n_evaluated
    ids = s.append_chat([{"role": "user", "content": "Another one?"}])
    assert s.n_evaluated - before <= len(ids) - len(first.prompt_ids)
    second = s.generate(max_tokens=12, temperature=0)
    assert second.prompt_ids == ids and s.tokens == ids + second.ids
    # The same conversation in one go gives the same reply.
    msgs = s.history[:3]
    assert engine.chat(msgs, max_tokens=12, temperature=0).ids == second.ids


def test_append_text_then_generate_is_complete(engine):
    s = engine.session()
    ids = s.append_text("The capital of France is")
    assert ids == engine.tokenize("The capital of France is")
    r = s.generate(max_tokens=8, temperature=0)
    assert r.ids == engine.complete("The capital of France is", max_tokens=8, temperature=0).ids
    s.append_tokens(engine.tokenize(" Also,", add_special=False))
    more = s.generate(max_tokens=4, temperature=0, stream=True)
    assert len([p for p in more if p.id is not None]) <= 4
    s.reset()
    assert s.tokens == []


def test_save_restore(engine, tmp_path):
    s = engine.session()
    s.append_chat([{"role": "user", "content": "Count to three."}])
    s.generate(max_tokens=10, temperature=0)
    path = tmp_path / "chat.json"
    s.save(path)
    t = engine.session()
    t.restore(str(path))
    assert t.tokens == s.tokens and t.history == s.history
    msg = [{"role": "user", "content": "And to four?"}]
    s.append_chat(msg)
    t.append_chat(msg)
    assert t.generate(max_tokens=8, temperature=0).ids == s.generate(max_tokens=8, temperature=0).ids
    path.write_text("{}")
    with pytest.raises(kiln.InvalidArgumentError, match="not a kiln session file"):
        t.restore(path)
    with pytest.raises(kiln.KilnIOError):
        t.restore(tmp_path / "missing.json")


def test_context_full_and_shift(engine):
    small = kiln.Engine(engine.path, n_ctx=64)
    s = small.session()
    s.append_text("Once upon a time")
    r = s.generate(temperature=0, ignore_eos=True)
    assert r.finish_reason == "context_full" and len(s.tokens) == 64
    del s  # frees its KV blocks (the pool holds one full context)
    shifting = small.session(context_shift=4)
    shifting.append_text("Once upon a time")
    r = shifting.generate(temperature=0, ignore_eos=True, max_tokens=100)
    assert r.finish_reason == "length" and len(r.ids) == 100


def test_calls_wait_but_not_for_an_open_stream(engine):
    s = engine.session()
    s.append_text("Once upon a time")
    stream = s.generate(max_tokens=8, temperature=0, stream=True)
    next(stream)
    with pytest.raises(RuntimeError, match="a stream from this session is unfinished"):
        s.tokens
    with pytest.raises(RuntimeError, match="a stream from this session is unfinished"):
        s.generate(max_tokens=1)
    rest = list(stream)
    assert len(s.tokens) == len(engine.tokenize("Once upon a time")) + 1 + len(rest)
    s.generate(max_tokens=10**5, ignore_eos=True, stream=True).cancel()  # abandoned: frees it
    assert s.generate(max_tokens=1).finish_reason == "length"
    # A call from another thread waits for the running one.
    import threading

    results = []
    t = threading.Thread(target=lambda: results.append(s.generate(max_tokens=40, temperature=0, ignore_eos=True)))
    t.start()
    more = s.generate(max_tokens=5, temperature=0, ignore_eos=True)
    t.join()
    assert len(results[0].ids) == 40 and len(more.ids) == 5
