#!/usr/bin/env python3
"""GRPO on a small torch policy with ulorl: UloRL's segment scheduler drives the rollout (responses are
decoded in segments across steps, under whichever policy version is current), the verifier's rewards
become group advantages (verl's preset) after DAPO's dynamic-sampling filter, the fused linear head +
policy loss (clip-higher, k3 KL to a reference, entropy bonus) trains the head without holding the
[N, V] logits, and the KL, entropy and reference-reset controllers adjust the step.

The policy: token t of a response to prompt p is drawn from softmax(head(tanh(E[p] + P[t]))). The
verifier rewards a response with at least two copies of the prompt's target token. Run:

    PYTHONPATH=python:build/<preset>/python python3 examples/python/grpo_step.py
"""

import copy

import torch

import ulorl

V, H, L_MAX, G, PROMPTS = 12, 32, 12, 4, 8
EOS = 0


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.prompt = torch.nn.Embedding(PROMPTS, H)
        self.pos = torch.nn.Embedding(L_MAX, H)
        self.head = torch.nn.Linear(H, V)

    def hidden(self, prompts, positions):
        return torch.tanh(self.prompt(prompts) + self.pos(positions))


def target_of(prompt):
    return 1 + prompt % (V - 1)


def reward(prompt, tokens):
    return 1.0 if sum(1 for x in tokens if x == target_of(prompt)) >= 2 else 0.0


def decode(policy, item, prompt, gen):
    """The engine: up to item.max_new_tokens tokens from item.start_token on; EOS ends the response."""
    pos = torch.arange(item.start_token, item.start_token + item.max_new_tokens)
    with torch.no_grad():
        logits = policy.head(policy.hidden(torch.full_like(pos, prompt), pos))
        toks = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(-1).tolist()
    if EOS in toks:
        return toks[: toks.index(EOS) + 1], "eos"
    return toks, "segment_end"


def grpo_step(policy, reference, opt, batch, kl_ctl, ent_ctl):
    """One GRPO update on released experience; returns the loss metrics."""
    B = len(batch["responses"])
    tokens = torch.zeros(B, L_MAX, dtype=torch.int64)
    mask = torch.zeros(B, L_MAX, dtype=torch.bool)
    prompts = torch.zeros(B, dtype=torch.int64)
    rewards = torch.zeros(B, dtype=torch.float32)
    for i, r in enumerate(batch["responses"]):
        toks = batch["tokens"][r["response_id"]]
        tokens[i, : len(toks)] = torch.tensor(toks)
        mask[i, : len(toks)] = True
        prompts[i] = r["group_id"] % PROMPTS
        rewards[i] = reward(int(prompts[i]), toks)
    group_ids = torch.tensor([r["group_id"] for r in batch["responses"]])
    keep, kept = ulorl.dynamic_sampling_filter(rewards, group_ids)
    if kept["kept_groups"] == 0:
        return None, rewards.mean().item()
    tokens, mask, prompts, rewards, group_ids = tokens[keep], mask[keep], prompts[keep], rewards[keep], group_ids[keep]
    b = tokens.shape[0]
    positions = torch.arange(L_MAX).expand(b, L_MAX)
    preset = ulorl.advantage_preset("verl", estimator="grpo")
    adv = ulorl.broadcast_to_tokens(ulorl.group_advantages(rewards, group_ids, preset), mask, preset)
    flat_p, flat_t = prompts.unsqueeze(1).expand(b, L_MAX).reshape(-1), positions.reshape(-1)
    with torch.no_grad():
        # POIS (UloRL): every old log-prob comes from the current policy, so the first ratio is 1.
        old, ent = ulorl.logprobs_from_logits(policy.head(policy.hidden(flat_p, flat_t)), tokens.reshape(-1))
        ref, _ = ulorl.logprobs_from_logits(reference.head(reference.hidden(flat_p, flat_t)), tokens.reshape(-1))
    old, ref = old.view(b, L_MAX), ref.view(b, L_MAX)
    entropy = ent.view(b, L_MAX)[mask].mean().item()
    # Two epochs; each accumulates two micro-batches under the batch's global normaliser (the
    # micro-batch gradients sum exactly to the full batch's), then takes one optimizer step.
    norm = ulorl.global_normalizer("token_mean", ulorl.count_batch(mask))
    coef = ent_ctl.bonus(entropy)
    for _ in range(2):
        opt.zero_grad()
        merged = None
        for rows in torch.tensor_split(torch.arange(b), 2):
            if len(rows) == 0:
                continue
            n = len(rows) * L_MAX
            hidden = policy.hidden(flat_p.view(b, L_MAX)[rows].reshape(n), flat_t.view(b, L_MAX)[rows].reshape(n))
            loss, m = ulorl.linear_head_policy_loss(
                hidden, policy.head.weight, policy.head.bias, tokens[rows].reshape(n), old[rows], adv[rows], mask[rows],
                ref_log_prob=ref[rows], kl_coef=kl_ctl.value, entropy_coef=coef, eps_low=0.2, eps_high=0.28,
                normalizer=norm)
            loss.backward()
            merged = m if merged is None else {k: merged[k] + m[k] for k in ("loss", "pg_loss", "kl_loss",
                                                                           "clipped", "tokens", "sequences")}
        opt.step()
    # The last epoch's metrics: losses and counts add over micro-batches.
    merged["clip_fraction"] = merged["clipped"] / merged["tokens"]
    merged["entropy"] = entropy
    return merged, rewards.mean().item()


def main(steps=30, seed=3):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    policy = Policy()
    reference = copy.deepcopy(policy).requires_grad_(False)
    opt = torch.optim.Adam(policy.parameters(), lr=0.05)
    sched = ulorl.SegmentScheduler(group_size=G, max_response_tokens=L_MAX, num_segments=3,
                                   max_active_responses=8 * G, release_batch_groups=4)
    kl_ctl = ulorl.KLController(type="adaptive", init_coef=0.02, target_kl=0.05, horizon=200.0)
    ent_ctl = ulorl.EntropyController(target_entropy=1.0, init_coef=0.0, step_up=0.002, max_coef=0.02)
    resets = ulorl.ReferenceResetPolicy(on_plateau=False, on_kl_share=True, max_kl_share=0.5, kl_share_patience=3,
                                        cooldown_steps=5)
    tokens = {}  # response id -> committed tokens (the engine's KV state)
    history, version = [], 0
    for step in range(steps):
        sched.offer_prompts(2)
        plan = sched.plan()
        for it in plan["items"]:
            toks, outcome = decode(policy, it, it.group_id % PROMPTS, gen)
            tokens.setdefault(it.response_id, []).extend(toks)
            sched.report(it.response_id, len(toks), outcome)
        sched.end_step()
        if step == steps // 2:  # checkpoint + restore mid-run: the scheduler carries on unchanged
            blob = sched.save()
            sched = ulorl.SegmentScheduler.from_bytes(blob)
            assert sched.save() == blob
        batch = sched.take_experience()
        if not batch["responses"]:
            continue
        # Provenance: tokens written under older versions are recomputed under the current one (POIS).
        stale = sum(ulorl.recompute_token_count(r["spans"], current_version=version, mode="pois")
                    for r in batch["responses"] if r["spans"])
        batch["tokens"] = tokens
        m, mean_reward = grpo_step(policy, reference, opt, batch, kl_ctl, ent_ctl)
        for r in batch["responses"]:
            tokens.pop(r["response_id"], None)
        history.append(mean_reward)
        if m is None:
            print(f"step {step:2d}: every group had equal rewards (filtered), reward {mean_reward:.2f}")
            continue
        version += 1
        sched.update_policy(version)
        entropy = m["entropy"]
        kl = m["kl_loss"] / kl_ctl.value  # the batch's token-mean KL of the last epoch
        beta = kl_ctl.update(kl, int(m["sequences"]))
        ent_ctl.update(entropy)
        action = resets.observe_step(step, m["kl_loss"], m["pg_loss"])
        if action["reset_reference"]:
            reference.load_state_dict(policy.state_dict())
        print(f"step {step:2d}: reward {mean_reward:.2f}  loss {m['loss']:+.4f}  clip {m['clip_fraction']:.3f}  "
              f"kl {kl:.4f}  beta {beta:.4f}  entropy {entropy:.3f}  recomputed {stale:3d} tokens"
              + ("  [reference reset]" if action["reset_reference"] else ""))
    c = sched.counters
    assert c["generated_tokens"] == c["released_tokens"] + sched.live_tokens + c["dropped_tokens"]
    first, last = sum(history[:5]) / 5, sum(history[-5:]) / 5
    print(f"mean reward: first 5 updates {first:.2f}, last 5 updates {last:.2f}")
    assert last > first, "the policy did not improve"


if __name__ == "__main__":
    main()
