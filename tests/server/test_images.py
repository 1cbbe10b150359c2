"""The official `openai` client sending images (data: URLs) to `kiln serve --mmproj`.

The model is SmolLM2-135M with SmolVLM's image tokens and the tiny synthetic idefics3 encoder
(written by scripts/test-server.sh into $KILN_VISION_DIR). Agreement with llama.cpp is checked
in crates/kiln-server/tests/images.rs; here the client's shapes, that the image matters, and
the errors.
"""

import base64
import os
import sys
import unittest

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kiln_server import Server  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VISION = os.environ.get("KILN_VISION_DIR")
SERVER = None


def setUpModule():
    global SERVER
    if not VISION:
        raise unittest.SkipTest("KILN_VISION_DIR is not set (run scripts/test-server.sh)")
    SERVER = Server("-m", os.path.join(VISION, "lm.gguf"), "--mmproj", os.path.join(VISION, "mmproj.gguf"),
                    "-c", "512", "--parallel", "2", "--alias", "m")


def tearDownModule():
    if SERVER:
        SERVER.close()


def data_url(name):
    with open(os.path.join(ROOT, "tests", "fixtures", "vision", name), "rb") as f:
        return "data:image/png;base64," + base64.b64encode(f.read()).decode()


def ask(url):
    c = openai.OpenAI(base_url=SERVER.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    return c.chat.completions.create(model="m", temperature=0, max_tokens=12, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "Describe this image."}]}])


class Images(unittest.TestCase):
    def test_data_url(self):
        a = ask(data_url("test-1.stb.png"))
        self.assertEqual(a.choices[0].finish_reason, "length")
        self.assertEqual(a.usage.completion_tokens, 12)
        self.assertGreater(a.usage.prompt_tokens, 90)  # the image's rows count as prompt
        self.assertEqual(ask(data_url("test-1.stb.png")).choices[0].message.content, a.choices[0].message.content)
        # Twelve tokens: both images' answers begin "The image is a reference to the".
        self.assertNotEqual(ask(data_url("alpha.png")).choices[0].message.content, a.choices[0].message.content)

    def test_refused_urls(self):
        for url, want in [("http://127.0.0.1:9/x.png", "--allow-image-urls"), ("file:///etc/passwd", "data: URL"),
                          ("data:image/png;base64,aGVsbG8=", "not a readable image")]:
            with self.assertRaises(openai.BadRequestError) as e:
                ask(url)
            self.assertIn(want, str(e.exception))


if __name__ == "__main__":
    unittest.main()
