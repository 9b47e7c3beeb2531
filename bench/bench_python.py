#!/usr/bin/env python3
"""bench_python — ulorl.policy_loss called from Python against the same formula in plain torch
eager (forward + backward), in one process, on bench_torch.cpp's data: [B, T] = [256, 4096] float32
(1M tokens), clip-higher 0.2 / 0.28 + k3 KL (0.05) + entropy (0.01), token-mean over the batch.
The variants alternate (ulorl, torch, ulorl, torch, ...) and each reports its best round. The
Python call overhead is measured on a [1, 16] batch, where the kernel costs almost nothing.
logits_statistics (ulorl.logprobs_from_logits with entropies) is timed the same way against
log_softmax + gather + entropy on bench_torch.cpp's logits, [N, V] = [256, 151936] float32, forward
+ backward of lp * a + entropy * c. The header line names the kernels' instruction sets
(ulorl._ulorl.policy_loss_isa / logits_isa; ULORL_PYTHON_ISA=default selects the baseline ones).

With --bench-torch PATH (a built bench/bench_torch), the C++ adapter's policy_loss numbers of the
same run are printed beside the Python ones (the ratio Python / C++ is the binding's cost).

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=python:build/release/python python3 bench/bench_python.py \\
        [--rounds 7] [--only policy_loss|logits_statistics] [--logits-n 256] [--bench-torch build/release/bench/bench_torch]
"""

import argparse
import re
import subprocess
import time

import torch

import ulorl


def make_tokens(b, t, gen):
    old = -torch.rand(b, t, generator=gen) * 3
    lp = old + (torch.rand(b, t, generator=gen) - 0.5) * 0.6
    ref = old + (torch.rand(b, t, generator=gen) - 0.5) * 0.2
    adv = torch.randn(b, 1, generator=gen).expand(b, t).contiguous()
    mask = torch.arange(t).unsqueeze(0) < torch.randint(t // 2, t + 1, (b, 1), generator=gen)
    ent = torch.rand(b, t, generator=gen) * 2
    return lp, old, adv, mask, ref, ent


def torch_loss(lp, old, adv, m, ref, ent):
    r = torch.exp(lp - old)
    pg = torch.max(-adv * r, -adv * torch.clamp(r, 0.8, 1.28))
    d = ref - lp
    tok = pg + 0.05 * (torch.exp(d) - d - 1) - 0.01 * ent
    return (tok * m).sum() / m.sum()


def torch_stats(z, y):
    logp = torch.log_softmax(z, -1)
    return logp.gather(1, y.unsqueeze(1)).squeeze(1), -(torch.exp(logp) * logp).sum(-1)


def run_stats(ours, s):
    z0, y, a, c = s
    z = z0.detach().requires_grad_()
    lp, ent = ulorl.logprobs_from_logits(z, y) if ours else torch_stats(z, y)
    (lp * a + ent * c).sum().backward()


def run(ours, d, norm):
    lp0, old, adv, mask, ref, ent0 = d
    lp = lp0.clone().requires_grad_()
    ent = ent0.clone().requires_grad_()
    if ours:
        loss, _ = ulorl.policy_loss(lp, old, adv, mask, ref_log_prob=ref, entropy=ent, normalizer=norm, eps_low=0.2,
                                    eps_high=0.28, kl_coef=0.05, entropy_coef=0.01)
    else:
        loss = torch_loss(lp, old, adv, mask, ref, ent)
    loss.backward()


def best_of(rounds, reps, fns):
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, f in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(reps):
                f()
            best[i] = min(best[i], (time.perf_counter() - t0) / reps)
    return best


def cxx_numbers(path):
    env = {"ULORL_BENCH_TORCH_SKIP_MEMORY": "1", "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([path, "--benchmark_filter=^policy_loss/"], capture_output=True, text=True, check=True,
                         env=env).stdout
    m = re.search(r"policy_loss\s+ulorl\s+([\d.]+) ms\s+torch\s+([\d.]+) ms", out)
    if not m:
        raise SystemExit(f"bench_python: no policy_loss summary in the output of {path}:\n{out}")
    return float(m.group(1)) * 1e-3, float(m.group(2)) * 1e-3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", choices=("policy_loss", "logits_statistics"), help="time one of the two functions")
    ap.add_argument("--logits-n", type=int, default=256, help="logits rows of logits_statistics (V = 151936)")
    ap.add_argument("--bench-torch", help="path of a built bench_torch, for the C++ numbers of this run")
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(7)
    print(f"kernels: policy_loss {ulorl._ulorl.policy_loss_isa}, logits {ulorl._ulorl.logits_isa}")
    if args.only != "logits_statistics":
        bench_policy_loss(args, gen)
    if args.only != "policy_loss":
        bench_logits_statistics(args, gen)


def bench_policy_loss(args, gen):
    d = make_tokens(256, 4096, gen)
    norm = ulorl.global_normalizer("token_mean", ulorl.count_batch(d[3]))
    # The same loss and gradient first (float32: the two sum in different orders).
    lp = d[0].clone().requires_grad_()
    a, _ = ulorl.policy_loss(lp, d[1], d[2], d[3], ref_log_prob=d[4], entropy=d[5], normalizer=norm, eps_low=0.2,
                             eps_high=0.28, kl_coef=0.05, entropy_coef=0.01)
    b = torch_loss(d[0], *d[1:])
    assert abs(a.item() - b.item()) <= 1e-4 * abs(b.item()) + 1e-6, (a.item(), b.item())

    ours, theirs = best_of(args.rounds, 3, [lambda: run(True, d, norm), lambda: run(False, d, norm)])
    tiny = make_tokens(1, 16, gen)
    tnorm = ulorl.global_normalizer("token_mean", ulorl.count_batch(tiny[3]))
    t_ours, t_theirs = best_of(args.rounds, 200, [lambda: run(True, tiny, tnorm), lambda: run(False, tiny, tnorm)])

    print("policy_loss forward + backward, float32, one intra-op thread, best of %d rounds" % args.rounds)
    print(f"  [256, 4096] (1M tokens): ulorl (Python) {ours * 1e3:8.2f} ms   torch eager {theirs * 1e3:8.2f} ms"
          f"   torch / ulorl = {theirs / ours:.2f}x")
    print(f"  [1, 16] (call overhead): ulorl (Python) {t_ours * 1e6:8.1f} us   torch eager {t_theirs * 1e6:8.1f} us")
    if args.bench_torch:
        cu, ct = cxx_numbers(args.bench_torch)
        print(f"  C++ bench_torch, same machine: ulorl {cu * 1e3:8.2f} ms   torch {ct * 1e3:8.2f} ms   "
              f"torch / ulorl = {ct / cu:.2f}x")
        print(f"  Python ulorl / C++ ulorl = {ours / cu:.3f}   Python torch / C++ torch = {theirs / ct:.3f}")


def bench_logits_statistics(args, gen):
    n, vocab = args.logits_n, 151936
    s = (torch.randn(n, vocab, generator=gen) * 2, torch.randint(0, vocab, (n,), generator=gen),
         torch.randn(n, generator=gen), torch.randn(n, generator=gen))
    # The same statistics first.
    lp, ent = ulorl.logprobs_from_logits(s[0], s[1])
    tlp, tent = torch_stats(s[0], s[1])
    torch.testing.assert_close(lp, tlp, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ent, tent, rtol=1e-4, atol=1e-4)

    ours, theirs = best_of(args.rounds, 1, [lambda: run_stats(True, s), lambda: run_stats(False, s)])
    print("logits_statistics forward + backward, float32, one intra-op thread, best of %d rounds" % args.rounds)
    print(f"  [{n}, {vocab}]: ulorl (Python) {ours * 1e3:8.2f} ms   torch eager {theirs * 1e3:8.2f} ms"
          f"   torch / ulorl = {theirs / ours:.2f}x")


if __name__ == "__main__":
    main()
