#!/usr/bin/env python3
"""torch eager on the GPU, on the cases of bench_policy_loss_cuda, in the same run as ulorl's numbers.

The same computations as the CUDA policy loss: PPO with clip-higher (eps 0.2 / 0.28, log-ratio
clamp 20) times the mask over the step's normaliser, "lean" (log-probs, old log-probs, advantages,
mask) and "full" (+ k3 KL to a reference, rollout weights, entropy bonus), forward and backward with
respect to the log-probs (and entropies); and the loss from bf16 logits [N, 151936] (log-softmax in
float, gather, entropy, the lean loss, backward to the logits). For each case: time (median of
cudaEvent-timed runs after a warm-up) and peak memory above the inputs
(torch.cuda.max_memory_allocated). With --ulorl FILE (bench_policy_loss_cuda --json output) it
prints ulorl's time and extra memory beside torch's, and the ratios.

Usage: torch_cuda_policy_loss.py [--ulorl bench.json]
"""
import argparse
import json
import statistics

import torch


def ppo(lp, old, adv, mask, denom, ref=None, w=None, ent=None):
    log_ratio = torch.clamp(lp - old, -20.0, 20.0)
    ratio = torch.exp(log_ratio)
    pg = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.28))
    if w is not None:
        pg = pg * w
    loss = pg
    if ref is not None:
        e = ref - lp
        loss = loss + 0.01 * (torch.exp(e) - e - 1.0)
    if ent is not None:
        loss = loss - 0.001 * ent
    return (loss * mask).sum() / denom


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def peak_above(fn):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def loss_case(tokens, full, dtype):
    cols = 4096
    n = tokens // cols * cols
    g = torch.Generator(device="cuda").manual_seed(1)
    mk = lambda lo, hi: (lo + (hi - lo) * torch.rand(n, generator=g, device="cuda")).to(dtype)
    lp = mk(-4, 0).requires_grad_()
    old, adv = mk(-4, 0), mk(-2, 2)
    mask = ((torch.arange(n, device="cuda") % cols) < cols * 9 // 10).float()
    ref, w = (mk(-4, 0), mk(0.5, 1.5)) if full else (None, None)
    ent = mk(0, 3).requires_grad_() if full else None
    denom = 0.9 * n

    def step():
        lp.grad = None
        if ent is not None:
            ent.grad = None
        ppo(lp.float(), old.float(), adv.float(), mask, denom, None if ref is None else ref.float(),
            None if w is None else w.float(), None if ent is None else ent.float()).backward()

    name = f"loss {'full' if full else 'lean'} {'f32' if dtype == torch.float32 else 'bf16'} {n >> 20}M tokens"
    return name, timed(step, 20), peak_above(step)


def logits_case(tokens):
    vocab = 151936
    g = torch.Generator(device="cuda").manual_seed(2)
    x = (12 * torch.rand(tokens, vocab, generator=g, device="cuda") - 6).to(torch.bfloat16).requires_grad_()
    y = torch.zeros(tokens, dtype=torch.long, device="cuda")
    old = -14 + 4 * torch.rand(tokens, generator=g, device="cuda")
    adv = -2 + 4 * torch.rand(tokens, generator=g, device="cuda")
    mask = ((torch.arange(tokens, device="cuda") % 1024) < 1024 * 9 // 10).float()

    def step():
        x.grad = None
        logp_all = torch.log_softmax(x.float(), dim=-1)
        lp = logp_all.gather(-1, y[:, None])[:, 0]
        ppo(lp, old, adv, mask, 0.9 * tokens).backward()

    return f"from logits bf16 {tokens} x 151936 in place", timed(step, 5), peak_above(step)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ulorl", help="bench_policy_loss_cuda --json output")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_cuda_policy_loss: torch has no CUDA device")
        return 77
    ours = {}
    if args.ulorl:
        with open(args.ulorl) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    r = json.loads(line)
                    ours[r["case"]] = r
    rows = []
    for tokens in (4 << 20, 16 << 20):
        for full in (False, True):
            for dtype in (torch.float32, torch.bfloat16):
                rows.append(loss_case(tokens, full, dtype))
    for tokens in (4096, 16384):
        rows.append(logits_case(tokens))
    print(f"{'case':44s} {'torch ms':>9s} {'torch extra MB':>14s} {'ulorl ms':>9s} {'ulorl extra MB':>14s} {'speedup':>8s} {'memory':>8s}")
    for name, ms, peak in rows:
        # ulorl's extra memory: its workspace, plus the gradient outputs the caller allocates
        # (4 B per token and gradient) except in place from logits.
        o = ours.get(name + " +scan") or ours.get(name)
        if o is None:
            print(f"{name:44s} {ms:9.3f} {peak / 2**20:14.1f}")
            continue
        n = 0 if name.startswith("from logits") else int(name.split()[3][:-1]) << 20
        grads = 0 if n == 0 else n * 4 * (2 if " full " in name else 1)
        extra = o["workspace"] + grads
        print(f"{name:44s} {ms:9.3f} {peak / 2**20:14.1f} {o['ms']:9.3f} {extra / 2**20:14.1f} {ms / o['ms']:7.2f}x"
              f" {peak / max(extra, 1):7.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
