"""The official `openai` client against a real `kiln serve` on smollm2 (docs/cli.md's contract).

Run with scripts/test-server.sh (it makes the venv with `openai` from PyPI and builds kiln).
"""

import base64
import http.client
import json
import math
import os
import struct
import subprocess
import sys
import threading
import time
import unittest
import urllib.parse

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kiln_server import KILN, Server, error_of  # noqa: E402

MODEL = os.environ.get("KILN_TEST_MODEL", "smollm2-135m")
N_CTX = 512
SERVER = None


def setUpModule():
    global SERVER
    SERVER = Server("-m", MODEL, "-c", str(N_CTX), "--parallel", "4", "--queue", "16")


def tearDownModule():
    if SERVER:
        SERVER.close()


def client(url=None, key="unused"):
    return openai.OpenAI(base_url=(url or SERVER.url) + "/v1", api_key=key, max_retries=0, timeout=120)


def chat(c, content, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 16)
    return c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kw)


class Routes(unittest.TestCase):
    def test_health_and_metrics(self):
        status, body, _ = SERVER.get("/health")
        self.assertEqual((status, json.loads(body)), (200, {"status": "ok"}))
        m = SERVER.metrics()
        for name in ["kiln_requests_running", "kiln_requests_waiting", "kiln_kv_cache_usage_ratio",
                     "kiln_prompt_tokens_total", "kiln_generation_tokens_total",
                     "kiln_time_to_first_token_seconds_count", "kiln_batch_size_count"]:
            self.assertIn(name, m)

    def test_models(self):
        c = client()
        models = c.models.list()
        self.assertEqual([m.id for m in models.data], [MODEL])
        self.assertEqual(models.data[0].owned_by, "kiln")
        self.assertEqual(c.models.retrieve(MODEL).id, MODEL)
        with self.assertRaises(openai.NotFoundError):
            c.models.retrieve("gpt-4o")

    def test_unknown_route(self):
        status, body, _ = SERVER.get("/v1/nothing")
        self.assertEqual(status, 404)
        self.assertIn("message", error_of(body))


class Chat(unittest.TestCase):
    def test_greedy_matches_kiln_run(self):
        prompt = "What is the capital of France?"
        r = chat(client(), prompt, max_tokens=16)
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.model, MODEL)
        choice = r.choices[0]
        self.assertEqual(choice.message.role, "assistant")
        self.assertIn(choice.finish_reason, ("stop", "length"))
        self.assertLessEqual(r.usage.completion_tokens, 16)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
        out = subprocess.run([KILN, "run", "-m", MODEL, "-c", str(N_CTX), "--temp", "0", "-n", "16", "--json",
                              "-p", prompt], capture_output=True, text=True, check=True)
        ref = json.loads(out.stdout)
        self.assertEqual(choice.message.content, ref["text"])
        self.assertEqual(r.usage.prompt_tokens, len(ref["prompt_ids"]))

    def test_stream_equals_whole(self):
        c = client()
        whole = chat(c, "Name three colors.", max_tokens=20).choices[0].message.content
        chunks = list(chat(c, "Name three colors.", max_tokens=20, stream=True,
                           stream_options={"include_usage": True}))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        self.assertEqual(text, whole)
        finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        self.assertEqual(len(finishes), 1)
        self.assertIsNotNone(chunks[-1].usage)
        self.assertEqual(chunks[-1].choices, [])
        self.assertGreater(chunks[-1].usage.completion_tokens, 0)

    def test_sse_ends_with_done(self):
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                           "stream": True}).encode()
        status, raw, headers = SERVER.post("/v1/chat/completions", body)
        self.assertEqual(status, 200)
        self.assertTrue(headers["content-type"].startswith("text/event-stream"))
        self.assertTrue(raw.decode().endswith("data: [DONE]\n\n"))

    def test_stop_string(self):
        c = client()
        whole = chat(c, "Count from 1 to 20, separated by commas.", max_tokens=24).choices[0].message.content
        cut = whole[len(whole) // 2:][:3]
        self.assertTrue(cut)
        r = chat(c, "Count from 1 to 20, separated by commas.", max_tokens=24, stop=[cut])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertEqual(r.choices[0].message.content, whole[: whole.index(cut)])

    def test_logprobs(self):
        r = chat(client(), "Say hello.", max_tokens=5, logprobs=True, top_logprobs=3)
        content = r.choices[0].logprobs.content
        self.assertGreater(len(content), 0)
        for e in content:
            self.assertLessEqual(e.logprob, 0.0)
            self.assertEqual(len(e.top_logprobs), 3)
            lps = [t.logprob for t in e.top_logprobs]
            self.assertEqual(lps, sorted(lps, reverse=True))
            # Greedy: the chosen token is the most likely one.
            self.assertAlmostEqual(e.logprob, lps[0], places=4)
            self.assertEqual(e.token, e.top_logprobs[0].token)

    def test_sampling_params_and_seed(self):
        c = client()
        kw = dict(temperature=0.9, top_p=0.9, seed=1234, max_tokens=12, presence_penalty=0.5,
                  frequency_penalty=0.5, logit_bias={"28": -100})
        a = chat(c, "Tell me a story.", **kw).choices[0].message.content
        b = chat(c, "Tell me a story.", **kw).choices[0].message.content
        self.assertEqual(a, b)

    def test_n_choices(self):
        r = chat(client(), "Pick a number.", n=3, temperature=1.0, seed=7, max_tokens=8)
        self.assertEqual(sorted(ch.index for ch in r.choices), [0, 1, 2])
        self.assertGreaterEqual(r.usage.completion_tokens, 3)
        self.assertTrue(all(ch.finish_reason in ("stop", "length") for ch in r.choices))

    def test_max_completion_tokens(self):
        r = client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Tell me a story."}],
                                             temperature=0, max_completion_tokens=3)
        self.assertEqual(r.usage.completion_tokens, 3)
        self.assertEqual(r.choices[0].finish_reason, "length")

    def test_content_parts_and_developer_role(self):
        c = client()
        a = c.chat.completions.create(model=MODEL, temperature=0, max_tokens=6, messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}])
        b = c.chat.completions.create(model=MODEL, temperature=0, max_tokens=6, messages=[
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}])
        self.assertEqual(a.choices[0].message.content, b.choices[0].message.content)


class Completions(unittest.TestCase):
    def test_text_and_stream(self):
        c = client()
        r = c.completions.create(model=MODEL, prompt="The sky is", max_tokens=10, temperature=0)
        self.assertEqual(r.object, "text_completion")
        text = r.choices[0].text
        self.assertTrue(text)
        streamed = "".join(ch.choices[0].text for ch in c.completions.create(
            model=MODEL, prompt="The sky is", max_tokens=10, temperature=0, stream=True) if ch.choices)
        self.assertEqual(streamed, text)

    def test_token_prompt_equals_text_prompt(self):
        c = client()
        out = subprocess.run([KILN, "tokenize", "-m", MODEL, "-p", "Once upon a time"], capture_output=True,
                             text=True, check=True)
        ids = json.loads(out.stdout)
        a = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0)
        b = c.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
        self.assertEqual(a.choices[0].text, b.choices[0].text)
        self.assertEqual(a.usage.prompt_tokens, len(ids))

    def test_logprobs_and_many_prompts(self):
        r = client().completions.create(model=MODEL, prompt=["One, two,", "Red, green,"], max_tokens=4,
                                        temperature=0, logprobs=2)
        self.assertEqual([ch.index for ch in r.choices], [0, 1])
        for ch in r.choices:
            lp = ch.logprobs
            self.assertEqual(len(lp.tokens), len(lp.token_logprobs))
            self.assertEqual(len(lp.top_logprobs[0]), 2)
            self.assertEqual("".join(lp.tokens), ch.text)


class Embeddings(unittest.TestCase):
    def test_unit_vectors(self):
        c = client()
        r = c.embeddings.create(model=MODEL, input=["The cat sat on the mat.", "A cat was sitting on a mat.",
                                                    "Stock prices fell sharply today."])
        vecs = [d.embedding for d in r.data]
        self.assertEqual(len(vecs), 3)
        self.assertEqual(len(vecs[0]), 576)
        for v in vecs:
            self.assertAlmostEqual(math.sqrt(sum(x * x for x in v)), 1.0, places=4)
        cos = lambda a, b: sum(x * y for x, y in zip(a, b))  # noqa: E731
        self.assertGreater(cos(vecs[0], vecs[1]), cos(vecs[0], vecs[2]))
        self.assertGreater(r.usage.prompt_tokens, 0)

    def test_equals_kiln_embed(self):
        f = client().embeddings.create(model=MODEL, input="hello world", encoding_format="float").data[0].embedding
        out = subprocess.run([KILN, "embed", "-m", MODEL, "-c", str(N_CTX), "--normalize", "--json", "hello world"],
                             capture_output=True, text=True, check=True)
        ref = json.loads(out.stdout)["data"][0]["embedding"]
        self.assertEqual(len(f), len(ref))
        for x, y in zip(f, ref):  # one f32 each, printed with different digit counts
            self.assertAlmostEqual(x, y, delta=1e-6 * max(1.0, abs(y)))

    def test_float_equals_base64(self):
        c = client()
        f = c.embeddings.create(model=MODEL, input="hello world", encoding_format="float").data[0].embedding
        status, body, _ = SERVER.post("/v1/embeddings", json.dumps(
            {"model": MODEL, "input": "hello world", "encoding_format": "base64"}).encode())
        self.assertEqual(status, 200)
        raw = base64.b64decode(json.loads(body)["data"][0]["embedding"])
        b = struct.unpack(f"<{len(raw) // 4}f", raw)
        self.assertEqual(len(b), len(f))
        for x, y in zip(f, b):
            self.assertAlmostEqual(x, y, places=6)


class Errors(unittest.TestCase):
    def assert_error(self, ctx, status, param=None, code=None):
        e = ctx.exception
        self.assertEqual(e.status_code, status)
        if param:
            self.assertEqual(e.param, param)
        if code:
            self.assertEqual(e.code, code)

    def test_malformed_json(self):
        for path in ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]:
            status, body, _ = SERVER.post(path, b"{not json")
            self.assertEqual(status, 400, path)
            err = error_of(body)
            self.assertEqual(set(err), {"message", "type", "param", "code"})
            self.assertEqual(err["type"], "invalid_request_error")

    def test_wrong_types(self):
        c = client()
        cases = [("temperature", "hot"), ("max_tokens", "many"), ("stream", "yes"), ("stop", 5), ("n", 1.5),
                 ("top_p", 3), ("logit_bias", {"x": 1}), ("seed", "s"), ("presence_penalty", 9)]
        for field, value in cases:
            with self.assertRaises(openai.BadRequestError, msg=field) as ctx:
                chat(c, "hi", **{field: value})
            self.assert_error(ctx, 400, param=field)

    def test_bad_messages(self):
        c = client()
        for messages in [[], "hi", [{"role": "wizard", "content": "x"}], [{"role": "user", "content": 5}],
                         [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]]:
            with self.assertRaises(openai.BadRequestError, msg=repr(messages)):
                c.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)

    def test_wrong_types_on_every_route(self):
        # Raw bodies: the client would refuse to send some of these.
        cases = [("/v1/completions", {"prompt": 5}, "prompt"),
                 ("/v1/completions", {"prompt": "x", "max_tokens": "many"}, "max_tokens"),
                 ("/v1/completions", {"prompt": "x", "temperature": [1]}, "temperature"),
                 ("/v1/completions", {"prompt": "x", "stream": 1}, "stream"),
                 ("/v1/embeddings", {"input": 5}, "input"),
                 ("/v1/embeddings", {"input": "x", "encoding_format": 3}, "encoding_format"),
                 ("/v1/chat/completions", {"messages": {"role": "user"}}, "messages")]
        for path, body, field in cases:
            status, raw, _ = SERVER.post(path, json.dumps({"model": MODEL, **body}).encode())
            self.assertEqual(status, 400, (path, body, raw))
            err = error_of(raw)
            self.assertEqual(err["type"], "invalid_request_error")
            self.assertIn(field, (err["param"] or "") + err["message"], (path, body, err))

    def test_unknown_model(self):
        with self.assertRaises(openai.NotFoundError) as ctx:
            client().chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        self.assert_error(ctx, 404, code="model_not_found")

    def test_huge_max_tokens(self):
        with self.assertRaises(openai.BadRequestError) as ctx:
            chat(client(), "hi", max_tokens=10**9)
        self.assert_error(ctx, 400, param="max_tokens", code="context_length_exceeded")

    def test_huge_max_tokens_completions(self):
        with self.assertRaises(openai.BadRequestError) as ctx:
            client().completions.create(model=MODEL, prompt="hi", max_tokens=10**9)
        self.assert_error(ctx, 400, param="max_tokens", code="context_length_exceeded")

    def test_prompt_beyond_context(self):
        c = client()
        with self.assertRaises(openai.BadRequestError) as ctx:
            chat(c, "hello " * (2 * N_CTX), max_tokens=None)
        self.assert_error(ctx, 400, code="context_length_exceeded")
        with self.assertRaises(openai.BadRequestError) as ctx:
            c.completions.create(model=MODEL, prompt="hello " * (2 * N_CTX))
        self.assert_error(ctx, 400, code="context_length_exceeded")
        with self.assertRaises(openai.BadRequestError) as ctx:
            c.embeddings.create(model=MODEL, input="hello " * (2 * N_CTX))
        self.assert_error(ctx, 400, code="context_length_exceeded")

    def test_unsupported_fields(self):
        c = client()
        functions = [{"name": "f", "parameters": {"type": "object"}}]
        with self.assertRaises(openai.BadRequestError) as ctx:
            chat(c, "hi", functions=functions)
        self.assert_error(ctx, 400, param="functions")
        with self.assertRaises(openai.BadRequestError) as ctx:
            chat(c, "hi", extra_body={"frobnicate": 1})
        self.assert_error(ctx, 400, param="frobnicate")
        with self.assertRaises(openai.BadRequestError) as ctx:
            c.completions.create(model=MODEL, prompt="x", echo=True, max_tokens=1)
        self.assert_error(ctx, 400, param="echo")

    def test_bad_values(self):
        c = client()
        for kw in [dict(max_tokens=0), dict(n=0), dict(top_logprobs=3), dict(logit_bias={"99999999": 1}),
                   dict(temperature=-1)]:
            with self.assertRaises(openai.BadRequestError, msg=repr(kw)):
                chat(c, "hi", **kw)
        with self.assertRaises(openai.BadRequestError):
            c.embeddings.create(model=MODEL, input=[])
        with self.assertRaises(openai.BadRequestError):
            c.completions.create(model=MODEL, prompt=[10**9], max_tokens=1)

    def test_odd_bodies_never_5xx(self):
        bodies = [b"", b"[]", b"null", b'"x"', b"{}", b'{"model": 5}', b'{"model": "%s", "max_tokens": 1e400}' % MODEL.encode(),
                  json.dumps({"model": MODEL, "messages": [{"content": "x"}]}).encode(),
                  json.dumps({"model": MODEL, "prompt": [[1, 2], "x"]}).encode(),
                  json.dumps({"model": MODEL, "prompt": "x", "stream_options": 3}).encode(),
                  json.dumps({"model": MODEL, "input": {"a": 1}}).encode()]
        for path in ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]:
            for b in bodies:
                status, body, _ = SERVER.post(path, b)
                self.assertTrue(400 <= status < 500, (path, b, status, body))

    def test_disconnect_mid_stream_leaves_others_alone(self):
        c = client()
        alone = chat(c, "Write a haiku about rain.", max_tokens=24).choices[0].message.content
        before = SERVER.metrics().get('kiln_requests_total{status="499"}', 0)
        u = urllib.parse.urlparse(SERVER.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps({
            "model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "stream": True,
            "temperature": 0, "ignore_eos": True}), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        self.assertEqual(resp.status, 200)
        resp.read1(256)
        other = {}
        t = threading.Thread(target=lambda: other.update(r=chat(c, "Write a haiku about rain.", max_tokens=24)))
        t.start()
        time.sleep(0.3)
        conn.sock.close()
        conn.close()
        t.join()
        self.assertEqual(other["r"].choices[0].message.content, alone)
        deadline = time.time() + 10
        while time.time() < deadline:
            m = SERVER.metrics()
            if m.get('kiln_requests_total{status="499"}', 0) > before and m["kiln_requests_running"] == 0:
                break
            time.sleep(0.1)
        self.assertGreater(m.get('kiln_requests_total{status="499"}', 0), before)
        self.assertEqual(m["kiln_requests_running"], 0)


class Disconnects(unittest.TestCase):
    def test_many_disconnects_leave_the_streams_beside_them_alone(self):
        """Four streams dropped (two mid-stream, two while queued: --parallel 4) next to two
        greedy streams that must finish with the text they give alone."""
        s = Server("-m", MODEL, "-c", "512", "--parallel", "4", "--queue", "16", "--alias", "dc")
        try:
            u = urllib.parse.urlparse(s.url)
            keep = ["Write a haiku about rain.", "List three colours."]

            def stream(prompt, max_tokens):
                conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
                conn.request("POST", "/v1/completions", json.dumps({
                    "model": "dc", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                    "stream": True, "ignore_eos": True}), {"Content-Type": "application/json"})
                return conn

            def text_of(conn):
                out = []
                for line in conn.getresponse():
                    line = line.decode().strip()
                    if line.startswith("data: {"):
                        out += [ch.get("text", "") for ch in json.loads(line[6:]).get("choices", [])]
                conn.close()
                return "".join(out)

            # Long enough that the kept streams still hold their slots while the last two queue.
            alone = [text_of(stream(p, 96)) for p in keep]
            running = [stream(f"Story number {i}: once upon a time", 400) for i in range(2)]
            for conn in running:
                r = conn.getresponse()
                self.assertEqual(r.status, 200)
                r.read1(64)
            kept = [stream(p, 96) for p in keep]
            time.sleep(0.3)
            waiting = [stream(f"Story number {i}: once upon a time", 400) for i in range(2, 4)]
            deadline = time.time() + 5
            while s.metrics()["kiln_requests_waiting"] < 1 and time.time() < deadline:
                time.sleep(0.02)
            self.assertGreaterEqual(s.metrics()["kiln_requests_waiting"], 1)
            # Two drop while streaming beside the kept ones; two while still queued.
            for conn in running + waiting:
                if conn.sock:
                    conn.sock.close()
                conn.close()
            self.assertEqual([text_of(c) for c in kept], alone)
            deadline = time.time() + 10
            while time.time() < deadline:
                m = s.metrics()
                if m["kiln_requests_running"] == 0 and m["kiln_requests_waiting"] == 0:
                    break
                time.sleep(0.1)
            self.assertEqual((m["kiln_requests_running"], m["kiln_requests_waiting"]), (0, 0))
            self.assertGreaterEqual(m.get('kiln_requests_total{status="499"}', 0), 2)
            self.assertEqual(s.get("/health")[0], 200)
        finally:
            s.close()


class Batching(unittest.TestCase):
    def test_greedy_alone_equals_batched(self):
        c = client()
        prompts = ["The capital of France is", "def fibonacci(n):", "Water boils at", "My favourite food is",
                   "In 1492,", "The quick brown fox"]
        run = lambda p: c.completions.create(  # noqa: E731
            model=MODEL, prompt=p, max_tokens=24, temperature=0).choices[0].text
        alone = [run(p) for p in prompts]
        before = SERVER.metrics()
        out = [None] * len(prompts)

        def go(i):
            out[i] = run(prompts[i])

        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(out, alone)
        after = SERVER.metrics()
        steps = after["kiln_batch_size_count"] - before["kiln_batch_size_count"]
        singles = after['kiln_batch_size_bucket{le="1"}'] - before['kiln_batch_size_bucket{le="1"}']
        self.assertLess(singles, steps, "no step batched more than one sequence")


class Auth(unittest.TestCase):
    def test_api_key(self):
        s = Server("-m", MODEL, "-c", "256", "--parallel", "1", "--api-key", "sekrit")
        try:
            with self.assertRaises(openai.AuthenticationError):
                client(s.url, "wrong").models.list()
            status, _, _ = s.get("/v1/models")
            self.assertEqual(status, 401)
            self.assertEqual([m.id for m in client(s.url, "sekrit").models.list().data], [MODEL])
            self.assertEqual(s.get("/health")[0], 200)
            self.assertEqual(s.get("/metrics")[0], 200)
        finally:
            s.close()


class Lifecycle(unittest.TestCase):
    def test_queue_full_then_drain_on_sigterm(self):
        s = Server("-m", MODEL, "-c", "512", "--parallel", "1", "--queue", "1", "--alias", "tiny")
        try:
            long = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 300, "temperature": 0,
                    "ignore_eos": True, "stream": True}
            streams = []
            u = urllib.parse.urlparse(s.url)
            for _ in range(2):  # one running, one waiting
                conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
                conn.request("POST", "/v1/completions", json.dumps(long), {"Content-Type": "application/json"})
                streams.append(conn)
                time.sleep(0.3)
            with self.assertRaises(openai.RateLimitError) as ctx:
                client(s.url).completions.create(model="tiny", prompt="hi", max_tokens=2)
            self.assertEqual(ctx.exception.response.headers.get("retry-after"), "1")
            code, seconds = s.terminate()
            self.assertEqual(code, 0)
            self.assertLess(seconds, 5.0)
            for conn in streams:
                body = conn.getresponse().read().decode()
                self.assertTrue(body.endswith("data: [DONE]\n\n"), body[-200:])
        finally:
            s.close()


class PrefixCache(unittest.TestCase):
    def test_follow_up_reuses_kv_and_answers_the_same(self):
        s = Server("-m", MODEL, "-c", "512", "--parallel", "1", "--alias", "pc")
        try:
            c = client(s.url)
            first = [{"role": "user", "content": "Name a fruit."}]
            answer = c.chat.completions.create(model="pc", messages=first, temperature=0,
                                               max_tokens=12).choices[0].message.content
            follow = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Why?"}]
            before = s.metrics()["kiln_prompt_tokens_cached_total"]
            reused = c.chat.completions.create(model="pc", messages=follow, temperature=0, max_tokens=12)
            cached = s.metrics()["kiln_prompt_tokens_cached_total"] - before
            self.assertGreater(cached, 10)
        finally:
            s.close()
        # The same follow-up on a fresh server, where nothing is cached.
        s = Server("-m", MODEL, "-c", "512", "--parallel", "1", "--alias", "pc")
        try:
            fresh = client(s.url).chat.completions.create(model="pc", messages=follow, temperature=0, max_tokens=12)
            self.assertEqual(s.metrics()["kiln_prompt_tokens_cached_total"], 0)
            self.assertEqual(reused.choices[0].message.content, fresh.choices[0].message.content)
        finally:
            s.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
