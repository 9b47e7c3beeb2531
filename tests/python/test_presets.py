"""Drop-in presets: the frameworks' losses written in plain torch the way each framework writes them
(verl core_algos.compute_policy_loss_vanilla + agg_loss + kl_penalty, TRL GRPOTrainer._compute_loss,
OpenRLHF PolicyLoss, NeMo-RL ClippedPGLossFn), against the one-call preset on random float64
batches: the same loss, gradients and logged metrics to 1e-10."""

import pytest
import torch

import ulorl

RTOL, ATOL = 1e-10, 1e-14


def rand_batch(gen, B=6, T=11, spread=0.5):
    lp = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3 - 0.05
    old = lp + torch.randn(B, T, generator=gen, dtype=torch.float64) * spread
    ref = lp + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.4
    mask = torch.rand(B, T, generator=gen) < 0.7
    mask[:, 0] = True  # every row has a valid token (the frameworks' seq means divide by rows)
    ent = torch.rand(B, T, generator=gen, dtype=torch.float64) * 2
    return lp, old, ref, mask, ent


def masked_mean(x, m):
    return (x * m).sum() / m.sum()


# ---- verl, written as verl writes it -----------------------------------------------------------------
def verl_agg_loss(loss_mat, loss_mask, loss_agg_mode):
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode == "seq-mean-token-sum":
        return torch.mean(torch.sum(loss_mat * loss_mask, dim=-1))
    if loss_agg_mode == "seq-mean-token-mean":
        return torch.mean(torch.sum(loss_mat * loss_mask, dim=-1) / torch.sum(loss_mask, dim=-1))
    if loss_agg_mode == "seq-mean-token-sum-norm":  # verl 1dda039b: over the non-empty rows, then the horizon
        return torch.sum(torch.sum(loss_mat * loss_mask, dim=-1)) / (loss_mask.sum(-1) > 0).sum() / loss_mask.shape[-1]
    raise ValueError(loss_agg_mode)


def verl_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, cliprange_low, cliprange_high,
                 clip_ratio_c=3.0, rollout_is_weights=None):
    negative_approx_kl = log_prob - old_log_prob
    negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = masked_mean(torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = verl_agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def verl_low_var_kl(log_prob, ref_log_prob):
    kl = ref_log_prob - log_prob
    kl = torch.clamp(kl, min=-20, max=20)
    ratio = torch.exp(kl)
    kld = (ratio - kl - 1).contiguous()
    return torch.clamp(kld, min=-10, max=10)


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                           "seq-mean-token-sum-norm"])
def test_verl_drop_in(gen, loss_agg_mode):
    for trial in range(3):
        lp, old, ref, mask, ent = rand_batch(gen)
        adv = torch.randn(lp.shape, generator=gen, dtype=torch.float64)
        w = torch.rand(lp.shape, generator=gen, dtype=torch.float64) + 0.5 if trial == 1 else None
        m = mask.double()
        x = lp.clone().requires_grad_()
        h = ent.clone().requires_grad_()
        pg_loss, clipfrac, ppo_kl, clipfrac_lower = verl_vanilla(old, x, adv, m, loss_agg_mode, 0.2, 0.28,
                                                                 rollout_is_weights=w)
        entropy_loss = verl_agg_loss(h, m, loss_agg_mode)
        kl_loss = verl_agg_loss(verl_low_var_kl(x, ref), m, loss_agg_mode)
        want = pg_loss - entropy_loss * 0.01 + kl_loss * 0.04
        want.backward()

        y = lp.clone().requires_grad_()
        e = ent.clone().requires_grad_()
        loss, metrics = ulorl.presets.verl.policy_loss(old, y, adv, mask, loss_mode="vanilla", clip_ratio_low=0.2,
                                                       clip_ratio_high=0.28, loss_agg_mode=loss_agg_mode,
                                                       rollout_is_weights=w, entropy=e, entropy_coeff=0.01,
                                                       ref_log_prob=ref, kl_loss_type="low_var_kl", kl_loss_coef=0.04)
        loss.backward()
        torch.testing.assert_close(loss, want.detach(), rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(y.grad, x.grad, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(e.grad, h.grad, rtol=RTOL, atol=ATOL)
        assert metrics["pg_loss"] == pytest.approx(pg_loss.item(), rel=RTOL, abs=ATOL)
        assert metrics["pg_clipfrac"] == pytest.approx(clipfrac.item(), abs=1e-15)
        assert metrics["ppo_kl"] == pytest.approx(ppo_kl.item(), rel=RTOL, abs=ATOL)
        assert metrics["pg_clipfrac_lower"] == pytest.approx(clipfrac_lower.item(), abs=1e-15)


def test_verl_grpo_advantage_drop_in(gen):
    B, T = 8, 5
    rewards = torch.zeros(B, T, dtype=torch.float64)
    rewards[:, -1] = torch.randint(0, 2, (B,), generator=gen).double()
    mask = torch.ones(B, T, dtype=torch.bool)
    index = [0, 0, 0, 1, 1, 1, 1, 2]
    adv, ret = ulorl.presets.verl.compute_grpo_outcome_advantage(rewards, mask, index)
    scores = rewards.sum(-1)
    want = torch.empty(B, dtype=torch.float64)
    for g in set(index):  # verl: (s - mean) / (std + eps), a singleton keeps mean 0 and std 1
        idx = [i for i in range(B) if index[i] == g]
        v = scores[idx]
        mean, std = (v.mean(), v.std()) if len(idx) > 1 else (torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))
        want[idx] = (v - mean) / (std + 1e-6)
    torch.testing.assert_close(adv, want.unsqueeze(-1) * mask, rtol=1e-13, atol=1e-15)
    assert torch.equal(adv, ret)


# ---- TRL, written as GRPOTrainer._compute_loss writes it -----------------------------------------------
def trl_loss(per_token_logps, old_per_token_logps, ref_per_token_logps, advantages, completion_mask, *, beta,
             epsilon_low, epsilon_high, loss_type, importance_sampling_level="token", delta=None,
             max_completion_length=None, num_items_in_batch=None, num_processes=1, gradient_accumulation_steps=1):
    if beta != 0.0:
        per_token_kl = (torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps)
                        - 1)
    old_per_token_logps = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
    log_ratio = per_token_logps - old_per_token_logps
    if importance_sampling_level == "token":
        log_importance_weights = log_ratio
    else:
        log_importance_weights = (log_ratio * completion_mask).sum(-1) / completion_mask.sum(-1).clamp(min=1.0)
        log_importance_weights = log_importance_weights.unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    if delta is not None:
        coef_1 = torch.clamp(coef_1, max=delta)
    per_token_loss1 = coef_1 * advantages.unsqueeze(1)
    per_token_loss2 = coef_2 * advantages.unsqueeze(1)
    per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    if loss_type == "grpo":
        loss = ((per_token_loss * completion_mask).sum(-1) / completion_mask.sum(-1).clamp(min=1.0)).mean()
        loss = loss / gradient_accumulation_steps
    elif loss_type == "bnpo":
        loss = (per_token_loss * completion_mask).sum() / completion_mask.sum().clamp(min=1.0)
        loss = loss / gradient_accumulation_steps
    elif loss_type == "dr_grpo":
        loss = (per_token_loss * completion_mask).sum() / (per_token_loss.size(0) * max_completion_length)
        loss = loss / gradient_accumulation_steps
    elif loss_type == "dapo":
        normalizer = num_items_in_batch / num_processes
        loss = (per_token_loss * completion_mask).sum() / normalizer
    coef = torch.exp(log_ratio) if importance_sampling_level == "token" else coef_1
    is_low = (coef < 1 - epsilon_low) & (advantages.unsqueeze(1) < 0)
    is_high = (coef > 1 + epsilon_high) & (advantages.unsqueeze(1) > 0)
    low = (is_low.double() * completion_mask).sum() / completion_mask.sum()
    high = (is_high.double() * completion_mask).sum() / completion_mask.sum()
    return loss, low, high


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_trl_drop_in(gen, loss_type, level):
    for trial in range(3):
        lp, old, ref, mask, _ = rand_batch(gen, spread=0.3)
        adv = torch.randn(lp.shape[0], generator=gen, dtype=torch.float64)
        m = mask.double()
        delta = 1.6 if trial == 2 and level == "token" else None
        opts = dict(beta=0.04, epsilon_low=0.2, epsilon_high=0.28, loss_type=loss_type,
                    importance_sampling_level=level, delta=delta, max_completion_length=lp.shape[1],
                    num_items_in_batch=float(mask.sum()) * 2.0, num_processes=2, gradient_accumulation_steps=2)
        x = lp.clone().requires_grad_()
        want, low, high = trl_loss(x, old if trial else None, ref, adv, m, **opts)
        want.backward()
        y = lp.clone().requires_grad_()
        loss, metrics = ulorl.presets.trl.grpo_loss(
            y, old if trial else None, adv, mask, ref_per_token_logps=ref, loss_type=loss_type, epsilon=0.2,
            epsilon_high=0.28, delta=delta, beta=0.04, importance_sampling_level=level,
            max_completion_length=lp.shape[1], gradient_accumulation_steps=2,
            num_items_in_batch=float(mask.sum()) * 2.0, num_processes=2)
        loss.backward()
        torch.testing.assert_close(loss, want.detach(), rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(y.grad, x.grad, rtol=RTOL, atol=ATOL)
        if level == "token":
            assert metrics["clip_ratio/low_mean"] == pytest.approx(low.item(), abs=1e-15)
            assert metrics["clip_ratio/high_mean"] == pytest.approx(high.item(), abs=1e-15)


# ---- OpenRLHF PolicyLoss and NeMo-RL ClippedPGLossFn ----------------------------------------------------
def test_openrlhf_drop_in(gen):
    for token_level_loss in (True, False):
        lp, old, _, mask, _ = rand_batch(gen)
        adv = torch.randn(lp.shape, generator=gen, dtype=torch.float64)
        m = mask.double()
        x = lp.clone().requires_grad_()
        log_ratio = torch.clamp(x - old, -20.0, 20.0)
        ratio = log_ratio.exp()
        surr1 = ratio * adv
        surr2 = ratio.clamp(1 - 0.2, 1 + 0.28) * adv
        loss = -torch.min(surr1, surr2)
        clip1 = torch.min(surr1, surr2)
        clip2 = torch.max(clip1, 3.0 * adv)
        loss = -torch.where(adv < 0, clip2, clip1)
        if token_level_loss:
            want = (loss * m).sum() / m.sum()
        else:
            want = ((loss * m).sum(-1) / m.sum(-1)).mean()
        want.backward()
        y = lp.clone().requires_grad_()
        got, metrics = ulorl.presets.openrlhf.policy_loss(y, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28,
                                                          dual_clip=3.0, token_level_loss=token_level_loss)
        got.backward()
        torch.testing.assert_close(got, want.detach(), rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(y.grad, x.grad, rtol=RTOL, atol=ATOL)
        assert metrics["ppo_kl"] == pytest.approx(masked_mean(old - lp, m).item(), rel=RTOL)


def test_nemo_rl_drop_in(gen):
    lp, old, ref, mask, _ = rand_batch(gen)
    adv = torch.randn(lp.shape, generator=gen, dtype=torch.float64)
    m = mask.double()
    global_valid_toks = float(mask.sum()) * 3
    x = lp.clone().requires_grad_()
    ratios = torch.exp(x - old)
    loss1 = -adv * ratios
    loss2 = -adv * ratios.clamp(1.0 - 0.2, 1.0 + 0.28)
    clip_loss = torch.max(loss1, loss2)
    # NeMo-RL weighs the reference KL by exp(logp - sg(logp)): value 1, derivative 1.
    kl = torch.exp(x - x.detach()) * (torch.exp(ref - x) - (ref - x) - 1)
    want = ((clip_loss + 0.01 * kl) * m).sum() / global_valid_toks
    want.backward()
    y = lp.clone().requires_grad_()
    got, _ = ulorl.presets.nemo_rl.clipped_pg_loss(y, old, adv, mask, ratio_clip_min=0.2, ratio_clip_max=0.28,
                                                   reference_policy_logprobs=ref, reference_policy_kl_penalty=0.01,
                                                   reference_policy_kl_type="k3", global_valid_toks=global_valid_toks)
    got.backward()
    torch.testing.assert_close(got, want.detach(), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(y.grad, x.grad, rtol=RTOL, atol=ATOL)
