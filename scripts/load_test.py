#!/usr/bin/env python3
"""Bounded load test of `kiln serve` on loopback: 1, 2, 4, 8, 16, 32 concurrent streaming
clients. Reports the aggregate decode curve, kiln_batch_size p50 per level, whether greedy
outputs equal the same requests run alone, peak RSS against model + parallel x n_ctx KV +
64 MiB, and the 32-client rate against a single stream and kiln's own pp512.

    python3 scripts/load_test.py [-m smollm2-135m] [-n 64] [-c 512] [--json]

Uses only the standard library; needs target/release/kiln. Shared machines are noisy:
quote ratios taken in one run.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "server"))
from kiln_server import KILN, Server  # noqa: E402

import http.client  # noqa: E402
import urllib.parse  # noqa: E402

TOPICS = ["the sea", "a red fox", "winter", "a robot", "the moon", "coffee", "a lost key", "the city at night",
          "a library", "rain", "an old map", "a garden", "the desert", "a violin", "trains", "a lighthouse",
          "snow", "a market", "the forest", "a storm", "a clock", "bridges", "a cat", "mountains", "a letter",
          "the river", "a kite", "candles", "a ship", "the sun", "a bakery", "stars"]


def stream_one(url, model, prompt, n_tokens, out):
    """One streaming completion; records text, token count and timings."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    body = {"model": model, "prompt": prompt, "max_tokens": n_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    out["status"] = r.status
    text, first, tokens = [], None, 0
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            out["error"] = ev["error"]
            break
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
        for ch in ev.get("choices", []):
            if ch.get("text"):
                first = first or time.perf_counter()
                text.append(ch["text"])
    out.update(text="".join(text), tokens=tokens, t0=t0, first=first or time.perf_counter(),
               end=time.perf_counter())
    conn.close()


def batch_hist(metrics_text):
    b = {}
    for line in metrics_text.splitlines():
        if line.startswith("kiln_batch_size_bucket"):
            le = line.split('le="')[1].split('"')[0]
            b[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return b


def p50(before, after):
    d = sorted((le, after[le] - before.get(le, 0)) for le in after)
    total = d[-1][1]
    for le, c in d:
        if total and c >= total / 2:
            return le
    return None


def kv_bytes_per_token(model):
    out = subprocess.run([KILN, "inspect", "-m", model, "--json"], capture_output=True, text=True, check=True)
    md = json.loads(out.stdout)["metadata"]
    arch = md["general.architecture"]
    n_layer = md[f"{arch}.block_count"]
    n_head = md[f"{arch}.attention.head_count"]
    n_head_kv = md.get(f"{arch}.attention.head_count_kv", n_head)
    head_dim = md.get(f"{arch}.attention.key_length", md[f"{arch}.embedding_length"] // n_head)
    return n_layer * 2 * n_head_kv * head_dim * 2, json.loads(out.stdout)["size"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-n", "--n-tokens", type=int, default=64)
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--levels", default="1,2,4,8,16,32")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    parallel = max(levels)
    extra = ["-t", str(a.threads)] if a.threads else []
    srv = Server("-m", a.model, "-c", str(a.ctx), "--parallel", str(parallel), "--queue", str(2 * parallel),
                 "--alias", "load", *extra)
    report = {"model": a.model, "n_tokens": a.n_tokens, "n_ctx": a.ctx, "parallel": parallel, "levels": []}
    try:
        prompts = [f"Write a short poem about {TOPICS[i % len(TOPICS)]}." for i in range(parallel)]
        # Every prompt alone first: the reference outputs and the single-stream rate.
        alone, rates = [], []
        for p in prompts:
            o = {}
            stream_one(srv.url, "load", p, a.n_tokens, o)
            alone.append(o["text"])
            rates.append((o["tokens"] - 1) / max(o["end"] - o["first"], 1e-9))
        rates.sort()
        single = rates[len(rates) // 2]
        report["single_stream_tok_s"] = single
        mismatches = 0
        for c in levels:
            before = batch_hist(srv.get("/metrics")[1].decode())
            outs = [{} for _ in range(c)]
            threads = [threading.Thread(target=stream_one, args=(srv.url, "load", prompts[i], a.n_tokens, outs[i]))
                       for i in range(c)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=600)
            wall = time.perf_counter() - t0
            after = batch_hist(srv.get("/metrics")[1].decode())
            done = sum(1 for o in outs if o.get("status") == 200 and o.get("tokens") == a.n_tokens)
            same = sum(1 for i, o in enumerate(outs) if o.get("text") == alone[i])
            mismatches += c - same
            tokens = sum(o.get("tokens", 0) for o in outs)
            lvl = {"clients": c, "completed": done, "greedy_equal": same, "tokens": tokens, "wall_s": wall,
                   "aggregate_tok_s": tokens / wall,
                   "batch_size_p50": p50(before, after)}
            report["levels"].append(lvl)
            if not a.json:
                print(f"{c:3d} clients: {done}/{c} completed, {same}/{c} greedy equal, "
                      f"{tokens / wall:7.1f} tok/s aggregate, batch p50 {lvl['batch_size_p50']}", flush=True)
        with open(f"/proc/{srv.proc.pid}/status") as f:
            hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
        kv_tok, model_size = kv_bytes_per_token(a.model)
        limit = model_size + parallel * a.ctx * kv_tok + 64 * 2**20
        report.update(peak_rss=hwm, rss_limit=limit, greedy_mismatches=mismatches)
        code, secs = srv.terminate()
        report.update(sigterm_exit=code, sigterm_s=secs)
    finally:
        srv.close()
    bench = subprocess.run([KILN, "bench", "-m", a.model, "-p", "512", "-n", "0", "-r", "2", "--json", *extra],
                           capture_output=True, text=True, check=True)
    pp512 = json.loads(bench.stdout)[0]["avg_ts"]
    top = report["levels"][-1]["aggregate_tok_s"]
    report.update(pp512_tok_s=pp512, ratio_vs_single=top / single, ratio_vs_pp512=top / pp512)
    if a.json:
        print(json.dumps(report))
    else:
        mib = 2**20
        print(f"single stream {single:.1f} tok/s; {parallel} clients {top:.1f} tok/s = {top / single:.2f}x single, "
              f"{top / pp512:.2f}x pp512 ({pp512:.1f} tok/s)")
        print(f"peak RSS {report['peak_rss'] / mib:.1f} MiB (limit {limit / mib:.1f} MiB); greedy mismatches "
              f"{mismatches}; SIGTERM exit {report['sigterm_exit']} in {report['sigterm_s']:.2f} s")
    ok = (mismatches == 0 and report["peak_rss"] <= limit and report["sigterm_exit"] == 0
          and all(lv["completed"] == lv["clients"] for lv in report["levels"]))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
