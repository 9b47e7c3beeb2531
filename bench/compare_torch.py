#!/usr/bin/env python3
"""Compare ulorl's throughput with PyTorch eager on the CPU, case by case.

ulorl's number comes from the built Google Benchmark binary (run with --benchmark_format=json);
torch's from the same computation written the way the frameworks write it, forward + backward.

    python3 bench/compare_torch.py [BENCH_BINARY] [--suite loss] [--json] [--sizes 1048576,4194304]

Suites are registered in SUITES: a suite is a function(args) -> list of `Case`. Add one (e.g. a
`logits` suite driving bench/bench_logits) by writing its function and adding it to SUITES; the
binary then defaults to build/release/bench/bench_<suite>.

Needs torch (Debian: `apt-get install python3-torch`, importable by /usr/bin/python3). torch runs
single-threaded by default (--threads) to match the single-threaded ulorl benchmark.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List


@dataclass
class Case:
    name: str               # printed case name
    bench_filter: str       # Google Benchmark regex selecting ulorl's benchmark for this case
    items: int              # items (tokens, rows) per torch call, to turn seconds into items/s
    torch_fn: Callable[[], None]  # one forward + backward in torch


def torch_time(fn: Callable[[], None], min_time: float, repeats: int) -> float:
    """Median seconds per call over `repeats` batches of calls lasting at least min_time each."""
    fn()  # warm-up (allocator, first-touch)
    per_call = []
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= min_time:
                break
        per_call.append(dt / n)
    return statistics.median(per_call)


def ulorl_rates(binary: str, filters: List[str], min_time: float) -> Dict[str, float]:
    """items_per_second of every benchmark matching one of `filters`, by benchmark name."""
    regex = "|".join(f"({f})" for f in filters)
    cmd = [binary, f"--benchmark_filter={regex}", "--benchmark_format=json", f"--benchmark_min_time={min_time}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    data = json.loads(out)
    return {b["name"]: float(b["items_per_second"]) for b in data["benchmarks"] if b.get("run_type", "iteration") == "iteration"}


# ---- suite: loss ----------------------------------------------------------------------------------
def suite_loss(args) -> List[Case]:
    import torch

    cases = []
    for n in args.sizes:
        row_len = 8192
        g = torch.Generator().manual_seed(7)
        old = -4 * torch.rand(n, generator=g)
        lp0 = old + (torch.rand(n, generator=g) - 0.5) * 0.8
        ref = lp0 + (torch.rand(n, generator=g) - 0.5) * 0.5
        adv = (torch.rand(n, generator=g) - 0.5) * 2
        idx = torch.arange(n)
        mask = ((idx % row_len) < row_len - (idx // row_len) % 1000).to(torch.uint8)
        lp = lp0.clone().requires_grad_(True)

        def step(lp=lp, old=old, ref=ref, adv=adv, mask=mask):
            # verl's vanilla clip-higher (no dual clip needed for the comparison) + k3 (low_var_kl)
            # with verl's clamps + token-mean: the ops an eager trainer runs, forward and backward.
            lp.grad = None
            m = mask.to(lp.dtype)
            x = torch.clamp(lp - old, -20.0, 20.0)
            r = torch.exp(x)
            l1 = -adv * r
            l2 = -adv * torch.clamp(r, 0.8, 1.28)
            pg = torch.maximum(l1, l2)
            u = torch.clamp(ref - lp, -20.0, 20.0)
            kl = torch.clamp(torch.exp(u) - u - 1, -10.0, 10.0)
            loss = ((pg + 0.04 * kl) * m).sum() / m.sum()
            loss.backward()
            # the metric trainers log (clip fraction), as the fused kernel computes it too
            with torch.no_grad():
                ((l2 > l1).to(lp.dtype) * m).sum() / m.sum()

        cases.append(Case(name=f"clip_higher+k3+token_mean/float32/{n}",
                          bench_filter=f"^BM_policy_loss<float>/{n}/0(/|$)", items=n, torch_fn=step))
        # check_values=false: no value scans, which is what torch does (it never checks).
        cases.append(Case(name=f"clip_higher+k3+token_mean/float32/{n}/check_values=false",
                          bench_filter=f"^BM_policy_loss<float, false>/{n}/0(/|$)", items=n, torch_fn=step))
    return cases


# ---- suite: logits --------------------------------------------------------------------------------
def suite_logits(args) -> List[Case]:
    """log_softmax + gather + entropy on [N, V = 151936] float32 logits, as verl/TRL write it in eager
    mode: forward alone, and forward + backward of g_lp * log_prob + g_ent * entropy. --sizes are row
    counts N here (default 64,1024: torch holds several [N, V] temporaries, ~0.6 GB each at N = 1024).
    Items are logits (N * V) per second; ulorl's from BM_forward/seq and BM_fwd_bwd/seq."""
    import torch

    vocab = 151936
    rows = args.sizes if args.sizes != [1048576, 4194304, 16777216] else [64, 1024]
    cases = []
    for n in rows:
        g = torch.Generator().manual_seed(11)
        x0 = torch.randn(n, vocab, generator=g) * 3
        labels = torch.randint(0, vocab, (n,), generator=g)
        g_lp = torch.full((n,), -1.0 / n)
        g_ent = torch.full((n,), 0.01)
        x = x0.clone().requires_grad_(True)

        def stats(z, labels=labels):  # bind this case's tensors (closures in a loop bind late)
            logp = torch.log_softmax(z, dim=-1)
            chosen = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
            entropy = -(logp.exp() * logp).sum(-1)
            return chosen, entropy

        def fwd(x0=x0, stats=stats):
            with torch.no_grad():
                stats(x0)

        def fwd_bwd(x=x, stats=stats, g_lp=g_lp, g_ent=g_ent):
            x.grad = None
            chosen, entropy = stats(x)
            (g_lp * chosen + g_ent * entropy).sum().backward()

        cases.append(Case(name=f"logits forward N={n} V={vocab}", bench_filter=f"^BM_forward/seq/{n}(/|$)",
                          items=n * vocab, torch_fn=fwd))
        cases.append(Case(name=f"logits forward+backward N={n} V={vocab}", bench_filter=f"^BM_fwd_bwd/seq/{n}(/|$)",
                          items=n * vocab, torch_fn=fwd_bwd))
    return cases


SUITES: Dict[str, Callable] = {"loss": suite_loss, "logits": suite_logits}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", nargs="?", help="bench binary (default build/release/bench/bench_<suite>)")
    ap.add_argument("--suite", default="loss", choices=sorted(SUITES))
    ap.add_argument("--json", action="store_true", help="one JSON object per case per line")
    ap.add_argument("--sizes", default="1048576,4194304,16777216", help="comma-separated problem sizes")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds per measurement")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    binary = args.binary or os.path.join("build", "release", "bench", f"bench_{args.suite}")
    if not os.path.exists(binary):
        print(f"compare_torch: bench binary {binary} not found (build with -DULORL_BUILD_BENCH=ON)", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        print("compare_torch: torch is not importable by " + sys.executable +
              " (Debian: apt-get install python3-torch, run with /usr/bin/python3)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)

    cases = SUITES[args.suite](args)
    rates = ulorl_rates(binary, [c.bench_filter for c in cases], args.min_time)
    for c in cases:
        import re
        ours = next((v for k, v in rates.items() if re.search(c.bench_filter, k)), float("nan"))
        theirs = c.items / torch_time(c.torch_fn, args.min_time, args.repeats)
        ratio = ours / theirs
        if args.json:
            print(json.dumps({"case": c.name, "ulorl_per_s": ours, "torch_per_s": theirs, "ratio": ratio}), flush=True)
        else:
            print(f"{c.name:45s} ulorl {ours / 1e6:9.1f} M/s   torch {theirs / 1e6:8.1f} M/s   ratio {ratio:6.1f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
