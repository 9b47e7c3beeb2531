"""The frameworks' drop-ins (ulorl.presets.verl, .trl, .openrlhf, .nemo_rl, .liger) and ulorl's own functions on
CUDA tensors against the same calls on the CPU: every output on the inputs' device with the CPU's values (float32:
rtol 1e-5, atol 1e-6), gradients included, metrics as the CPU's. The operators without a device kernel run on
host copies and warn once (ignored here); the host fallback is set on for the module, so that an extension built
without its CUDA kernels runs them all that way. Skipped where torch has no GPU."""

import warnings

import numpy as np
import pytest
import torch

import ulorl
import ulorl.presets.verl as v
from ulorl.presets import liger, nemo_rl, openrlhf, trl

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

DEVICE = "cuda"

F32 = torch.float32
UIDS = np.array(["a", "a", "b", "b", "b", "c", "a", "d"], dtype=object)  # verl's uid strings, "d" a singleton


@pytest.fixture(autouse=True, scope="module")
def _host_fallback_on():
    previous = ulorl.set_host_fallback(True)
    yield
    ulorl.set_host_fallback(previous)


def _to(x, device):
    if isinstance(x, dict):
        return {k: _to(y, device) for k, y in x.items()}
    return x.to(device) if isinstance(x, torch.Tensor) else x


def _close(got, want, where="output"):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), where
        assert got.device.type == torch.device(DEVICE).type, f"{where} is on {got.device}"
        assert got.dtype == want.dtype and got.shape == want.shape, where
        tol = dict(rtol=1e-5, atol=1e-6) if want.dtype != torch.float64 else dict(rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(got.detach().cpu(), want.detach(), equal_nan=True, msg=where, **tol)
    elif isinstance(want, dict):
        assert set(got) == set(want), where
        for k in want:
            _close(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, (tuple, list)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6, nan_ok=True), where
    elif hasattr(want, "batch"):  # verl's DataProto (or its stand-in)
        _close(got.batch, want.batch, f"{where}.batch")
    else:
        assert got == want, where


def check(fn, *args, grads=(), seed=None, **kwargs):
    """``fn`` on the CPU arguments and on their CUDA copies: the same outputs, on the device, and the same
    gradients of the (first) output's sum with respect to the arguments at the indices ``grads``."""
    results = []
    for device in ("cpu", DEVICE):
        a = [_to(x, device) for x in args]
        for i in grads:
            a[i] = a[i].detach().clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the host fallback's note, once per process
            if seed is not None:
                torch.manual_seed(seed)
            out = fn(*a, **_to(kwargs, device))
            if grads:
                (out[0] if isinstance(out, tuple) else out).sum().backward()
        results.append((out, [a[i].grad for i in grads]))
    (want, want_g), (got, got_g) = results
    _close(got, want)
    _close(got_g, want_g, "grad")


def batch(seed=0, B=5, T=7):
    """(old_log_prob, log_prob, advantages, mask, ref_log_prob): float32 [B, T]."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3
    lp, adv = old + torch.randn(B, T, generator=g) * 0.3, torch.randn(B, T, generator=g)
    m = (torch.rand(B, T, generator=g) > 0.3).to(F32)
    m[:, 0] = 1
    return old, lp, adv, m, old + torch.randn(B, T, generator=g) * 0.2


# ---- verl ------------------------------------------------------------------------------------------------

ACTOR = dict(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, tau_pos=1.0, tau_neg=1.05,
             policy_loss={"clip_cov_ratio": 0.2, "clip_cov_lb": -5.0}, global_batch_info={})


@pytest.mark.parametrize("mode", ["vanilla", "gspo", "dppo_tv", "kl_cov", "clip_cov"])
def test_verl_policy_losses(mode):
    old, lp, adv, m, _ = batch()
    agg = "seq-mean-token-mean" if mode == "gspo" else "token-mean"
    check(v.get_policy_loss_fn(mode), old, lp, adv, m, agg, ACTOR, grads=(1,), seed=7)


def test_verl_fused_policy_loss_agg_loss_kl_penalty():
    old, lp, adv, m, ref = batch(1)
    ent = torch.rand_like(lp) * 2
    check(v.policy_loss, old, lp, adv, m, grads=(1,), entropy=ent, entropy_coeff=0.01, ref_log_prob=ref,
          kl_loss_type="low_var_kl", kl_loss_coef=0.05, clip_ratio_high=0.28)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        check(v.agg_loss, lp, m, agg, grads=(0,))
    check(v.agg_loss, lp, m.bool(), "token-mean", 2, 40, grads=(0,))
    for name in ("kl", "mse", "low_var_kl", "k3+"):
        check(v.kl_penalty, lp, ref, name, grads=(0,))


@pytest.mark.parametrize("name", ["grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "gpg", "opo",
                                  "reinforce_plus_plus_baseline", "gdpo"])
def test_verl_outcome_advantages_with_uid_strings(name):
    g = torch.Generator().manual_seed(2)
    m = (torch.rand(8, 6, generator=g) > 0.3).to(F32)
    m[:, 0] = 1
    r = torch.randn(8, 6, generator=g) * m
    fn = v.get_adv_estimator_fn(name)
    check(fn, r, m, UIDS)
    index = torch.tensor([0, 0, 1, 1, 1, 2, 0, 3])
    check(lambda r, m: fn(r, m, index), r, m)  # the index stays a CPU tensor beside the device rewards
    if name == "gdpo":
        comps = {"fmt": np.array([1.0, 0, 1, 1, 0, 1, 0, 1]), "acc": np.linspace(0, 1, 8)}
        check(fn, r, m, UIDS, config={"gdpo_reward_keys": ["fmt", "acc"], "gdpo_reward_weights": [1.0, 0.5]},
              non_tensor_batch=comps, batch={})


def test_verl_gae_and_rollout_correction():
    old, lp, adv, m, ro = batch(3)
    check(v.compute_gae_advantage_return, adv, old, m, 0.99, 0.95)
    check(v.compute_reinforce_plus_plus_outcome_advantage, adv, m, config={"gamma": 0.9})
    check(v.compute_rollout_correction_and_rejection_mask, lp, ro, m, "token", 2.0, False, "token_k1,seq_mean_k3",
          "0.8_1.25,0.01")
    check(v.compute_rollout_correction_and_rejection_mask, lp, ro, m, rollout_is="sequence",
          rollout_is_threshold="0.5_2.0", rollout_is_batch_normalize=True)
    check(v.rollout_correction, lp, ro, m, rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_max_k2",
          rollout_rs_threshold=0.05)
    cfg = dict(ACTOR, policy_loss={"rollout_correction": {"loss_type": "reinforce", "rollout_is": "token",
                                                          "rollout_rs": "token_k2", "rollout_rs_threshold": 0.05}})
    check(v.get_policy_loss_fn("bypass_mode"), ro, lp, adv, m, "token-mean", cfg, grads=(1,))


# ---- TRL -------------------------------------------------------------------------------------------------


def test_trl_logits_functions():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 5, 11, generator=g) * 3
    index = torch.randint(0, 11, (3, 5), generator=g)
    check(trl.selective_log_softmax, logits, index, grads=(0,))
    check(trl.selective_log_softmax, logits, torch.randint(0, 11, (3, 5, 2), generator=g), grads=(0,))
    check(trl.entropy_from_logits, logits, grads=(0,))


def test_trl_masks_and_grpo_loss():
    old, lp, _, m, ref = batch(5)
    adv = torch.randn(lp.shape[0])
    mask = m.to(torch.int64)  # TRL's completion masks are int64
    samp = old + 0.3
    check(trl.get_off_policy_mask, adv.unsqueeze(1), lp, samp, mask, 0.1)
    check(trl.get_high_entropy_mask, None, torch.rand_like(lp), mask, 0.7)
    for loss_type in ("grpo", "dapo", "bnpo"):
        check(trl.grpo_loss, lp, old, adv, mask, grads=(0,), ref_per_token_logps=ref, beta=0.04, loss_type=loss_type,
              epsilon_high=0.28, off_policy_mask_threshold=0.1, sampling_per_token_logps=samp)
    check(trl.grpo_loss, lp, None, adv, mask, grads=(0,), importance_sampling_level="sequence",
          importance_sampling_ratio=torch.rand_like(lp) + 0.5)
    check(trl.rollout_correction, old, samp, m, vllm_importance_sampling_mode="token_truncate")


# ---- OpenRLHF --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [dict(dual_clip=3.0, clip_eps_high=0.28),
                                     dict(enable_vllm_is_correction=True, vllm_is_truncated_threshold=[0.5, 5.0]),
                                     dict(policy_loss_type="gspo")])
def test_openrlhf_policy_loss(options):
    old, lp, adv, m, ro = batch(6)
    fn = openrlhf.PolicyLoss(**options)
    check(fn, lp, old, adv, m, ro, grads=(0,))
    check(fn, lp, old, adv, None, ro, 1, torch.tensor(30.0), grads=(0,))  # no mask: every token, a tensor count
    check(openrlhf.policy_loss, lp, old, adv, m, grads=(0,), base_action_log_probs=ro, kl_estimator="k3",
          kl_coef=0.01)


def test_openrlhf_aggregate_loss_and_approx_kl():
    old, lp, _, m, ref = batch(7)
    for token_level in (True, False):
        check(openrlhf.aggregate_loss, lp, m, token_level, grads=(0,))
        check(openrlhf.aggregate_loss, lp, None, token_level, 2, torch.tensor(50.0), torch.tensor(8), grads=(0,))
    for est in ("k1", "k2", "k3"):
        check(openrlhf.compute_approx_kl, lp, ref, est, grads=(0,))


# ---- NeMo-RL ---------------------------------------------------------------------------------------------


def nemo_data(seed=8, B=4, S=9):
    g = torch.Generator().manual_seed(seed)
    d = {"token_mask": (torch.rand(B, S, generator=g) < 0.8).to(torch.int64), "sample_mask": torch.tensor([1, 1, 1, 0]),
         "advantages": torch.randn(B, S, generator=g), "prev_logprobs": -torch.rand(B, S, generator=g) * 2,
         "reference_policy_logprobs": -torch.rand(B, S, generator=g) * 2, "rewards": torch.tensor([1.0, 0, 2, 1])}
    d["token_mask"][:, 1] = 1
    d["generation_logprobs"] = d["prev_logprobs"] + torch.randn(B, S, generator=g) * 0.3
    return d, d["prev_logprobs"][:, 1:] + torch.randn(B, S - 1, generator=g) * 0.4


@pytest.mark.parametrize("options", [dict(), dict(ratio_clip_c=3.0, reference_policy_kl_type="k2"),
                                     dict(use_importance_sampling_correction=True,
                                          truncated_importance_sampling_type="tis",
                                          truncated_importance_sampling_ratio=1.5, positive_example_nll_weight=0.3),
                                     dict(sequence_level_importance_ratios=True, token_level_loss=False,
                                          use_importance_sampling_correction=True)])
def test_nemo_rl_clipped_pg_loss_fn(options):
    d, lp = nemo_data()
    m = d["token_mask"][:, 1:] * d["sample_mask"][:, None]
    fn = nemo_rl.ClippedPGLossFn(nemo_rl.ClippedPGLossConfig(**options))
    check(fn, lp, d, d["sample_mask"].sum(), m.sum(), grads=(0,))
    check(fn, lp, d, torch.tensor(7), torch.tensor(40.0), grads=(0,))


def test_nemo_rl_calculate_kl():
    _, lp, _, _, ref = batch(9)
    for kind in ("k1", "k2", "k3"):
        check(nemo_rl.calculate_kl, lp, ref, kind, 20.0, 10.0, grads=(0,))
        check(nemo_rl.calculate_kl, lp, ref, kind, 0.3, 0.2, torch.rand_like(lp) + 0.5, grads=(0, 5))


# ---- Liger -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [dict(beta=0.04, loss_type="dapo"), dict(beta=0.0, loss_type="grpo", delta=1.5),
                                     dict(beta=0.04, loss_type="luspo"),
                                     dict(loss_type="cispo", epsilon_high=0.5, use_ref_model=False)])
def test_liger_fused_linear_grpo_loss(options):
    B, T, H, V = 3, 6, 8, 20
    g = torch.Generator().manual_seed(10)
    x, w, b = torch.randn(B, T, H, generator=g), torch.randn(V, H, generator=g) * 0.3, torch.randn(V, generator=g)
    ids, adv = torch.randint(0, V, (B, T), generator=g), torch.randn(B, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.2).to(torch.int64)
    mask[:, 0] = 1
    old = -torch.rand(B, T, generator=g) * 3 - 1
    ref = old + torch.randn(B, T, generator=g) * 0.1
    loss = liger.LigerFusedLinearGRPOLoss(**options)
    check(loss, x, w, ids, mask, adv, b, ref, old, grads=(0, 1, 5))
    check(loss, x, w, ids, mask, adv, b, ref, None, vllm_is_ratio=torch.rand(B, T, generator=g) + 0.5, grads=(0, 1))


# ---- ulorl's own functions -------------------------------------------------------------------------------


def test_api_functions_with_host_side_arguments():
    old, lp, adv, m, ref = batch(11, B=8)
    scores, ids = adv[:, 0].contiguous(), [0, 0, 1, 1, 1, 2, 0, 3]
    check(ulorl.group_advantages, scores, np.array(ids))
    check(ulorl.broadcast_to_tokens, scores, m)
    check(ulorl.dynamic_sampling_filter, (scores > 0).to(F32), ids)
    check(ulorl.gpg_advantages, scores, ids)
    check(ulorl.pass_at_k_advantages, scores, [0, 0, 1, 1, 1, 2, 2, 0])
    check(ulorl.opo_advantages, scores, m, np.array(ids))
    check(ulorl.overlong_penalty, torch.tensor([10, 900, 1000, 1100]), max_length=1024, buffer_length=256)
    check(ulorl.policy_loss, lp, old, adv, m, grads=(0,), eps_high=0.28)
    check(ulorl.policy_loss, lp, old, adv, None, grads=(0,), agg_mode="seq_mean_token_mean", objective="gspo")
    check(ulorl.agg_loss, lp, None, grads=(0,))
    check(ulorl.agg_loss, lp, m, grads=(0,), agg_mode="seq_mean_token_sum")
    check(ulorl.kl_penalty, lp, ref, "k3", grads=(0,))
    check(ulorl.rollout_correction, old, ref, m, level="sequence", upper=3.0)
    logits, labels = torch.randn(6, 13) * 2, torch.randint(0, 13, (6,))
    check(ulorl.logits_statistics, logits, labels)
    check(ulorl.logprobs_from_logits, logits, labels, 0.7, grads=(0,))
