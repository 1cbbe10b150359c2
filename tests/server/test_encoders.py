"""The official `openai` client against `kiln serve` on an encoder, nomic-embed-text-v1.5
(docs/cli.md's contract): `embeddings.create` gives `kiln embed`'s vectors; inputs past the
context and rerank requests the model cannot serve are 400s naming why.

Run with scripts/test-server.sh (it makes the venv with `openai` from PyPI and builds kiln).
"""

import base64
import json
import math
import os
import struct
import subprocess
import sys
import unittest

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kiln_server import KILN, Server, error_of  # noqa: E402

MODEL = "nomic-embed-text-v1.5"
N_CTX = 128
SERVER = None
TEXTS = [
    "search_query: what do cats like to sit on?",
    "search_document: The cat sat on the mat all afternoon.",
    "search_document: Stock prices fell sharply after the announcement.",
    "Ünïcödé text, emoji 🙂 and CJK 漢字 in one input.",
    "search_document: " + "A longer passage about the history of printing. " * 8,
]


def setUpModule():
    global SERVER
    SERVER = Server("-m", MODEL, "-c", str(N_CTX), "--parallel", "2")


def tearDownModule():
    if SERVER:
        SERVER.close()


def client():
    return openai.OpenAI(base_url=SERVER.url + "/v1", api_key="unused", max_retries=0, timeout=120)


class Embeddings(unittest.TestCase):
    def test_equals_kiln_embed(self):
        r = client().embeddings.create(model=MODEL, input=TEXTS)
        self.assertEqual([d.index for d in r.data], list(range(len(TEXTS))))
        out = subprocess.run([KILN, "embed", "-m", MODEL, "-c", str(N_CTX), "--normalize", "--json", *TEXTS],
                             capture_output=True, text=True, check=True)
        ref = [d["embedding"] for d in json.loads(out.stdout)["data"]]
        for text, got, want in zip(TEXTS, r.data, ref):
            self.assertEqual(len(got.embedding), 768)
            self.assertEqual(len(got.embedding), len(want))
            # One f32 each, printed with different digit counts.
            err = max(abs(x - y) for x, y in zip(got.embedding, want))
            self.assertLess(err, 1e-6, text)
            self.assertAlmostEqual(math.sqrt(sum(x * x for x in got.embedding)), 1.0, places=4)
        cos = lambda a, b: sum(x * y for x, y in zip(a.embedding, b.embedding))  # noqa: E731
        self.assertGreater(cos(r.data[0], r.data[1]), cos(r.data[0], r.data[2]))
        self.assertGreater(r.usage.prompt_tokens, 0)

    def test_float_equals_base64(self):
        f = client().embeddings.create(model=MODEL, input=TEXTS[1]).data[0].embedding
        status, body, _ = SERVER.post("/v1/embeddings", json.dumps(
            {"model": MODEL, "input": TEXTS[1], "encoding_format": "base64"}).encode())
        self.assertEqual(status, 200)
        raw = base64.b64decode(json.loads(body)["data"][0]["embedding"])
        self.assertEqual(list(struct.unpack(f"<{len(raw) // 4}f", raw)), [struct.unpack("<f", struct.pack("<f", x))[0]
                                                                          for x in f])


class Errors(unittest.TestCase):
    def test_input_beyond_the_context(self):
        with self.assertRaises(openai.BadRequestError) as ctx:
            client().embeddings.create(model=MODEL, input=["short", "word " * (2 * N_CTX)])
        e = ctx.exception
        self.assertEqual((e.status_code, e.code, e.param), (400, "context_length_exceeded", "input"))
        self.assertIn(f"the context is {N_CTX}", e.message)

    def test_empty_input(self):
        with self.assertRaises(openai.BadRequestError):
            client().embeddings.create(model=MODEL, input=[])

    def test_rerank_without_a_rank_head(self):
        status, body, _ = SERVER.post("/v1/rerank", json.dumps(
            {"model": MODEL, "query": "cats", "documents": ["a cat", "a dog"]}).encode())
        self.assertEqual(status, 400)
        err = error_of(body)
        self.assertEqual(err["type"], "invalid_request_error")
        self.assertIn("no classification head", err["message"])

    def test_rerank_bad_bodies(self):
        for body in [b"{not json", b"[]", b'{"query": "q"}', b'{"query": "q", "documents": []}']:
            status, raw, _ = SERVER.post("/v1/rerank", body)
            self.assertEqual(status, 400, (body, raw))
            self.assertEqual(error_of(raw)["type"], "invalid_request_error")


if __name__ == "__main__":
    unittest.main()
