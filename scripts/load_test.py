#!/usr/bin/env python3
"""Bounded load test of `kiln serve` on loopback: 1, 2, 4, 8, 16, 32 concurrent streaming
greedy clients. Prints one table row per level: aggregate decode tok/s (tokens after each
stream's first, from the first first-token to the last end, as the single-stream rate is
measured) and its ratio to a single stream, tok/s over the whole wall time, kiln_batch_size
p50, where a scheduler step's time goes, the machine's load average. Then checks: every
request completed, greedy outputs equal the same requests run alone, peak RSS <= model +
parallel x n_ctx KV + 64 MiB, SIGTERM exits 0; and quotes the top level against a single
stream and kiln's own pp512 (`kiln bench`, run just before and after that level).

    python3 scripts/load_test.py [-m smollm2-135m] [-t 2] [-n 64] [-c 512] [--json]

Exits 1 when a check fails. Standard library only; needs target/release/kiln. Shared
machines are noisy: quote the ratios of one run, with its load column.
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


def stream_one(url, model, prompt, n_tokens, out, ignore_eos=True):
    """One streaming completion; records text, token count, usage and timings."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    body = {"model": model, "prompt": prompt, "max_tokens": n_tokens, "temperature": 0, "ignore_eos": ignore_eos,
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
            out["usage"] = ev["usage"]
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


def load_avg():
    return os.getloadavg()[0]


def step_counters(m):
    """(steps, step tokens, {phase: seconds}) from the server's metrics."""
    phases = {k.split('"')[1]: v for k, v in m.items() if k.startswith("kiln_step_seconds_total")}
    return m.get("kiln_steps_total", 0), m.get("kiln_step_tokens_total", 0), phases


def pp512(model, extra):
    out = subprocess.run([KILN, "bench", "-m", model, "-p", "512", "-n", "0", "-r", "2", "--json", *extra],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)[0]["avg_ts"]


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
    ap.add_argument("-b", "--batch-size", type=int, default=None, help="the server's step token budget")
    ap.add_argument("--device", default="cpu", help="cpu (default: no GPU driver probe in the RSS) or auto/gpu")
    ap.add_argument("--levels", default="1,2,4,8,16,32")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    parallel = max(levels)
    extra = ["--device", a.device] + (["-t", str(a.threads)] if a.threads else [])
    srv_extra = extra + (["-b", str(a.batch_size)] if a.batch_size else [])
    say = (lambda *x, **k: None) if a.json else print
    srv = Server("-m", a.model, "-c", str(a.ctx), "--parallel", str(parallel), "--queue", str(2 * parallel),
                 "--alias", "load", *srv_extra)
    report = {"model": a.model, "n_tokens": a.n_tokens, "n_ctx": a.ctx, "parallel": parallel, "args": srv_extra,
              "levels": []}
    try:
        prompts = [f"Write a short poem about {TOPICS[i % len(TOPICS)]}." for i in range(parallel)]
        # Every prompt alone first: the reference outputs and the single-stream decode rate.
        alone, rates = [], []
        for p in prompts:
            o = {}
            stream_one(srv.url, "load", p, a.n_tokens, o)
            alone.append(o["text"])
            rates.append((o["tokens"] - 1) / max(o["end"] - o["first"], 1e-9))
        rates.sort()
        single = rates[len(rates) // 2]
        report["single_stream_tok_s"] = single
        say(f"single stream (median of {len(rates)} alone): {single:.1f} tok/s decode, load {load_avg():.2f}")
        say("x single: against requests run alone just before and after the level (median of 4).")
        say("clients | done  | greedy= | decode tok/s | single | x single | wall tok/s | batch p50 | ms/step | "
            "tok/step | forward | sample+stream | load")
        mismatches = 0

        def local_single(k):
            """Median decode rate of two requests alone: bracketing each level in time keeps its
            ratio honest when the machine's load drifts during the run."""
            r = []
            for p in (prompts[k % parallel], prompts[(k + 1) % parallel]):
                o = {}
                stream_one(srv.url, "load", p, a.n_tokens, o)
                r.append((o["tokens"] - 1) / max(o["end"] - o["first"], 1e-9))
            return r

        for li, c in enumerate(levels):
            top_level = li == len(levels) - 1
            if top_level:
                pp_before = pp512(a.model, extra)
            ref = local_single(2 * li)
            m0 = srv.metrics()
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
            s0, e0, ph0 = step_counters(m0)
            s1, e1, ph1 = step_counters(srv.metrics())
            ref = sorted(ref + local_single(2 * li + 1))
            ref_single = (ref[1] + ref[2]) / 2
            if top_level:
                pp_after = pp512(a.model, extra)
            steps = max(s1 - s0, 1)
            ph = {k: ph1[k] - ph0.get(k, 0) for k in ph1}
            busy = max(sum(ph.values()), 1e-9)
            done = sum(1 for o in outs if o.get("status") == 200 and o.get("tokens") == a.n_tokens)
            same = sum(1 for i, o in enumerate(outs) if o.get("text") == alone[i])
            mismatches += c - same
            tokens = sum(o.get("tokens", 0) for o in outs)
            # Decode rate as the single stream's: tokens after each first one, over the time
            # from the first first-token to the last end (prompt processing excluded).
            window = max(o["end"] for o in outs if "end" in o) - min(o["first"] for o in outs if "first" in o)
            decode = sum(max(o.get("tokens", 0) - 1, 0) for o in outs) / max(window, 1e-9)
            lvl = {"clients": c, "completed": done, "greedy_equal": same, "tokens": tokens, "wall_s": wall,
                   "wall_tok_s": tokens / wall, "aggregate_tok_s": decode, "single_tok_s": ref_single,
                   "x_single": decode / ref_single,
                   "batch_size_p50": p50(before, after), "ms_per_step": 1000 * busy / steps,
                   "tokens_per_step": (e1 - e0) / steps,
                   "forward_share": ph.get("forward", 0) / busy, "sample_share": ph.get("sample", 0) / busy,
                   "load": load_avg()}
            report["levels"].append(lvl)
            say(f"{c:7d} | {done:2d}/{c:<2d} | {same:2d}/{c:<2d}   | {lvl['aggregate_tok_s']:12.1f} | "
                f"{ref_single:6.1f} | {lvl['x_single']:8.2f} | {lvl['wall_tok_s']:10.1f} | {lvl['batch_size_p50']:9} | "
                f"{lvl['ms_per_step']:7.1f} | "
                f"{lvl['tokens_per_step']:8.1f} | {100 * lvl['forward_share']:6.1f}% | "
                f"{100 * lvl['sample_share']:12.1f}% | {lvl['load']:.2f}", flush=True)
        with open(f"/proc/{srv.proc.pid}/status") as f:
            hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
        kv_tok, model_size = kv_bytes_per_token(a.model)
        limit = model_size + parallel * a.ctx * kv_tok + 64 * 2**20
        report.update(peak_rss=hwm, rss_limit=limit, greedy_mismatches=mismatches)
        code, secs = srv.terminate()
        report.update(sigterm_exit=code, sigterm_s=secs)
    finally:
        srv.close()
    pp = (pp_before + pp_after) / 2
    top_lvl = report["levels"][-1]
    top = top_lvl["aggregate_tok_s"]
    report.update(pp512_tok_s=pp, pp512_before_after=[pp_before, pp_after], ratio_vs_single=top_lvl["x_single"],
                  ratio_vs_pp512=top / pp)
    mib = 2**20
    say(f"{parallel} clients: {top:.1f} tok/s decode = {top_lvl['x_single']:.2f}x a single stream "
        f"({top_lvl['single_tok_s']:.1f} around it; {single:.1f} at the start), {top / pp:.2f}x pp512 "
        f"({pp:.1f} tok/s: `kiln bench` {pp_before:.1f} just before, {pp_after:.1f} just after)")
    say(f"peak RSS {hwm / mib:.1f} MiB (limit {limit / mib:.1f} MiB = model {model_size / mib:.1f} + "
        f"{parallel} x {a.ctx} KV {parallel * a.ctx * kv_tok / mib:.1f} + 64); greedy mismatches {mismatches}; "
        f"SIGTERM exit {report['sigterm_exit']} in {report['sigterm_s']:.2f} s")
    if a.json:
        print(json.dumps(report))
    ok = (mismatches == 0 and report["peak_rss"] <= limit and report["sigterm_exit"] == 0
          and all(lv["completed"] == lv["clients"] for lv in report["levels"]))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
