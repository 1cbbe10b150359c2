"""Starts and stops a real `kiln serve` for the tests and the load test."""

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN = os.environ.get("KILN_BIN", os.path.join(ROOT, "target", "release", "kiln"))


class Server:
    """`kiln serve --port 0 ARGS`; waits for the "listening" line (or fails)."""

    def __init__(self, *args, timeout=120):
        self.proc = subprocess.Popen(
            [KILN, "serve", "--port", "0", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log = []
        self.url = None
        deadline = time.time() + timeout
        for line in self.proc.stderr:
            self.log.append(line)
            m = re.search(r"kiln: listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                break
            if time.time() > deadline:
                break
        if self.url is None:
            self.proc.kill()
            raise RuntimeError("kiln serve did not start:\n" + "".join(self.log))
        # Keep draining stderr so the server never blocks on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def get(self, path, headers=None):
        """(status, body bytes, headers) of a GET."""
        return request(self.url + path, None, headers)

    def post(self, path, body, headers=None):
        """(status, body bytes, headers) of a POST of raw bytes."""
        h = {"Content-Type": "application/json", **(headers or {})}
        return request(self.url + path, body, h)

    def metrics(self):
        _, body, _ = self.get("/metrics")
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def terminate(self, timeout=10):
        """SIGTERM; returns (exit code, seconds it took)."""
        t0 = time.time()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        return code, time.time() - t0

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stderr.close()


def request(url, body, headers=None):
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def error_of(body):
    return json.loads(body)["error"]
