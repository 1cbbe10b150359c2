"""Threads, cancellation, Ctrl-C, and memory over many calls."""

import os
import subprocess
import sys
import threading
import time

import pytest

from conftest import MODEL

PROMPTS = ["The history of Rome begins", "Photosynthesis is the process"]


def test_two_threads_get_what_each_gets_alone(engine):
    alone = [engine.complete(p, max_tokens=48, temperature=0, ignore_eos=True).ids for p in PROMPTS]
    results, spans = [None, None], [None, None]
    started = threading.Barrier(2)

    def run(i):
        started.wait()
        t0 = time.monotonic()
        results[i] = engine.complete(PROMPTS[i], max_tokens=48, temperature=0, ignore_eos=True)
        spans[i] = (t0, time.monotonic())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert [r.ids for r in results] == alone
    # They ran at once: each call began before the other ended.
    assert max(s[0] for s in spans) < min(s[1] for s in spans)


def test_generation_releases_the_gil(engine):
    ticks = []
    done = threading.Event()

    def count():
        while not done.is_set():
            ticks.append(1)
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    engine.complete(PROMPTS[0], max_tokens=32, temperature=0, ignore_eos=True)
    done.set()
    t.join()
    assert len(ticks) > 10


def test_cancel_session_from_another_thread(engine):
    s = engine.session()
    s.append_text(PROMPTS[0])
    timer = threading.Timer(0.3, s.cancel)
    timer.start()
    r = s.generate(max_tokens=100000, temperature=0, ignore_eos=True)
    assert r.finish_reason == "cancelled" and 0 < len(r.ids) < 100000
    # The request was consumed: the next call runs.
    assert s.generate(max_tokens=2, temperature=0).finish_reason == "length"


def test_cancel_stream(engine):
    stream = engine.complete(PROMPTS[1], max_tokens=100000, temperature=0, ignore_eos=True, stream=True)
    n = 0
    for _ in stream:
        n += 1
        if n == 5:
            stream.cancel()
    assert stream.result.finish_reason == "cancelled" and 5 <= len(stream.result.ids) < 100
    # Dropping an unfinished stream stops its worker too.
    it = iter(engine.complete(PROMPTS[1], max_tokens=100000, ignore_eos=True, stream=True))
    next(it)
    del it
    assert engine.complete(PROMPTS[1], max_tokens=2).finish_reason == "length"


def test_a_cancelled_stream_cancels_only_itself(engine):
    # Cancelled at once, the stream's worker may lock the session after the next call has:
    # the cancel must wait for its own worker, never end the next call.
    s = engine.session()
    s.append_text(PROMPTS[0])
    for _ in range(30):
        s.generate(max_tokens=10**5, ignore_eos=True, stream=True).cancel()
        assert s.generate(max_tokens=1).finish_reason == "length"
    # Read after cancel(), a stream ends "cancelled" however soon its worker started.
    stream = s.generate(max_tokens=10**5, ignore_eos=True, stream=True)
    stream.cancel()
    assert len(list(stream)) <= 1 and stream.result.finish_reason == "cancelled"


INTERRUPT = r"""
import os, signal, sys, threading, time
import kiln
# Python raises KeyboardInterrupt on SIGINT only where it was not ignored when the
# interpreter started; a shell's background job (how CI may start this) ignores it.
signal.signal(signal.SIGINT, signal.default_int_handler)
e = kiln.Engine(sys.argv[1], n_ctx=4096)
e.complete("Hi", max_tokens=2)
sent = []
def interrupt():
    sent.append(time.monotonic())
    os.kill(os.getpid(), signal.SIGINT)
threading.Timer(0.5, interrupt).start()
try:
    e.complete("Once upon a time", max_tokens=100000, temperature=0, ignore_eos=True)
    print("not interrupted")
except KeyboardInterrupt:
    print("latency_ms", (time.monotonic() - sent[0]) * 1e3)
# The engine still works, and the cancelled worker left it alone.
print("after", e.complete("Hi", max_tokens=3, temperature=0).finish_reason)
"""


def test_ctrl_c_raises_keyboard_interrupt_quickly():
    out = subprocess.run(
        [sys.executable, "-c", INTERRUPT, MODEL], capture_output=True, text=True, timeout=300
    ).stdout.split()
    assert out[0] == "latency_ms", out
    assert float(out[1]) < 200
    assert out[2:] == ["after", "length"]


def rss_mb():
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_many_generations_do_not_grow_memory(engine):
    def generations(n):
        for i in range(n):
            if i % 2:
                assert len(engine.complete("Hi", max_tokens=1, temperature=0.5, seed=i).ids) == 1
            else:
                assert len(list(engine.complete("Hi", max_tokens=1, stream=True))) == 1

    generations(100)
    rss, threads = rss_mb(), len(os.listdir("/proc/self/task"))
    generations(1000)
    grown = rss_mb() - rss
    assert grown < 8, f"RSS grew {grown:.1f} MiB over 1,000 generations"
    assert len(os.listdir("/proc/self/task")) <= threads + 2  # the worker threads end
