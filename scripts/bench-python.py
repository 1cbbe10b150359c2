#!/usr/bin/env python3
"""Decode speed of the Python package against the CLI: `engine.complete` (and a stream)
against `kiln bench`'s tg, interleaved round by round on the same model and threads.

    python scripts/bench-python.py [-m smollm2-135m] [-n 128] [-r 5] [-t THREADS]

Run it with the Python that has kiln installed (scripts/test-python.sh makes one under
$KILN_HOME/venv-python). Both sides count decode forwards per second: kiln bench times n
forwards; a completion of n tokens runs n-1 forwards after its prompt (the last token
needs none), timed as wall-clock around the call minus the prompt's own time, so the
binding's per-call costs (thread, session, result objects) are charged to it.
"""

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import kiln

ROOT = Path(__file__).resolve().parents[1]


def cli_tg(args) -> float:
    cmd = [str(ROOT / "target/release/kiln"), "bench", "-m", args.model, "-p", "0", "-n", str(args.n), "-r", "1", "--json"]
    if args.threads:
        cmd += ["-t", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)[0]["avg_ts"]


def py_tg(engine, args, stream: bool) -> float:
    kw = dict(max_tokens=args.n, temperature=0, ignore_eos=True)
    t0 = time.perf_counter()
    if stream:
        s = engine.complete("Hi", stream=True, **kw)
        for _ in s:
            pass
        r = s.result
    else:
        r = engine.complete("Hi", **kw)
    wall = time.perf_counter() - t0
    assert len(r.ids) == args.n
    return (args.n - 1) / (wall - r.timings.prompt_ms / 1e3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-n", type=int, default=128, help="tokens generated per run")
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int)
    args = ap.parse_args()
    engine = kiln.Engine(args.model, n_ctx=args.n + 64, threads=args.threads)
    py_tg(engine, args, False)  # warm-up (kiln bench warms up inside each run)
    rows = {"kiln bench": [], "complete": [], "complete(stream)": []}
    for i in range(args.rounds):
        rows["kiln bench"].append(cli_tg(args))
        rows["complete"].append(py_tg(engine, args, False))
        rows["complete(stream)"].append(py_tg(engine, args, True))
        print(f"round {i + 1}: " + "  ".join(f"{k} {v[-1]:.1f}" for k, v in rows.items()), flush=True)
    base = statistics.median(rows["kiln bench"])
    print(f"\n{Path(str(engine.path)).name} | {engine.backend} | tg{args.n}, median of {args.rounds} interleaved rounds")
    for k, v in rows.items():
        m = statistics.median(v)
        # The median of each round's ratio too: a round's runs share the machine's state.
        pairs = statistics.median(x / y for x, y in zip(v, rows["kiln bench"]))
        print(f"{k:>18}: {m:8.2f} tok/s  {m / base:.3f}x kiln bench  (per round: {pairs:.3f}x)")


if __name__ == "__main__":
    main()
