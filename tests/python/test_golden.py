"""Every golden case of tests/golden/*.json (the contract is tests/golden/README.md) through the
Python API, with the comparison rule of the C++ conformance runner (tests/conformance/runner.cpp):
every expected output present, |actual - expected| <= atol + rtol |expected| elementwise (defaults
rtol 1e-6, atol 1e-9), actual finite; a case expecting {"error": true} must raise ulorl.Error.

Each op maps the case's params onto the Python API the way the C++ runner maps them onto the C++ API
(tests/conformance/op_*.cpp); the few checks the runner makes itself (a missing required input, a
length mismatch of its JSON lists) are made here too, as ulorl.Error. Every case runs."""

import glob
import json
import math
import os

import pytest
import torch

import ulorl
from conftest import golden_dir

CASES = sorted(glob.glob(os.path.join(golden_dir(), "*.json")))


def num(v):
    if isinstance(v, str):
        return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[v]
    if isinstance(v, list):
        return [num(x) for x in v]
    return float(v)


def t64(v):
    return torch.tensor(num(v), dtype=torch.float64)


def ints(v):
    return torch.tensor(v, dtype=torch.int64)


def p(params, name, default=None):
    v = params.get(name)
    return default if v is None else v


def reject(function, argument, what):
    """A check the C++ runner makes itself (not the library), as ulorl.Error."""
    e = ulorl.Error(f"ulorl::{function}: argument '{argument}': {what}")
    e.function, e.argument, e.index = function, argument, -1
    raise e


def same_shape(fn, a_name, a, b_name, b):
    if tuple(a.shape) != tuple(b.shape):
        reject(fn, a_name, f"has shape {tuple(a.shape)} but '{b_name}' has {tuple(b.shape)}")


def opt64(inputs, name):
    return t64(inputs[name]) if inputs.get(name) is not None else None


def run_policy_loss(preset, params, inputs):
    old, lp, adv, mask = (t64(inputs[k]) for k in ("old_log_prob", "log_prob", "advantages", "response_mask"))
    w, sel = opt64(inputs, "rollout_is_weights"), opt64(inputs, "clip_cov_selection")
    rollout, ref = opt64(inputs, "rollout_log_prob"), opt64(inputs, "ref_log_prob")
    same_shape("policy_loss", "response_mask", mask, "log_prob", lp)
    if rollout is not None:
        same_shape("policy_loss", "rollout_log_prob", rollout, "log_prob", lp)
    if preset != "verl" and (w is not None or sel is not None):
        reject("policy_loss", "rollout_is_weights", "rollout_is_weights and clip_cov_selection are verl inputs")
    x = lp.clone().requires_grad_()
    if preset == "verl":
        # The verl cases of policy_loss and agg_loss follow verl b178a3cd (golden README): its
        # seq-mean-token-sum-norm, sum_norm_per_sequence=False.
        mode = p(params, "loss_mode", "vanilla")
        loss, m = ulorl.presets.verl.policy_loss(
            old, x, adv, mask, loss_mode=mode, clip_ratio_low=p(params, "clip_ratio_low", 0.2),
            clip_ratio_high=p(params, "clip_ratio_high", 0.2), clip_ratio_c=p(params, "clip_ratio_c", 3.0),
            tau_pos=p(params, "tau_pos", 1.0), tau_neg=p(params, "tau_neg", 1.05),
            loss_agg_mode=p(params, "loss_agg_mode", "token-mean"), dp_size=p(params, "dp_size", 1.0),
            batch_num_tokens=params.get("batch_num_tokens"), global_batch_size=params.get("global_batch_size"),
            loss_scale_factor=params.get("loss_scale_factor"), sum_norm_per_sequence=False, rollout_is_weights=w,
            dro_beta=params.get("dro_beta"), kl_cov_ratio=p(params, "kl_cov_ratio", 0.0002),
            ppo_kl_coef=p(params, "ppo_kl_coef", 0.1), clip_cov_ratio=p(params, "clip_cov_ratio", 0.0002),
            clip_cov_lb=p(params, "clip_cov_lb", 1.0), clip_cov_ub=p(params, "clip_cov_ub", 5.0),
            clip_cov_selection=sel)
        loss.backward()
        return {"pg_loss": m["pg_loss"], "grad_log_prob": x.grad, "pg_clipfrac": m["pg_clipfrac"],
                "ppo_kl": m["ppo_kl"], "pg_clipfrac_lower": m["pg_clipfrac_lower"]}
    if preset == "openrlhf":
        if mask.sum() == 0:
            reject("policy_loss", "response_mask", "openrlhf metrics divide by N = 0 valid tokens")
        th = params.get("vllm_is_truncated_threshold")
        loss, m = ulorl.presets.openrlhf.policy_loss(
            x, old, adv, mask, policy_loss_type=p(params, "policy_loss_type", "ppo"),
            clip_eps_low=p(params, "clip_eps_low", 0.2), clip_eps_high=p(params, "clip_eps_high", 0.2),
            dual_clip=params.get("dual_clip"), token_level_loss=p(params, "token_level_loss", True),
            dp_size=p(params, "dp_size", 1.0), batch_num_tokens=params.get("batch_num_tokens"),
            global_batch_size=params.get("global_batch_size"), rollout_log_probs=rollout,
            enable_vllm_is_correction=p(params, "enable_vllm_is_correction", False),
            vllm_is_correction_type=p(params, "vllm_is_correction_type", "tis"),
            **({} if th is None else {"vllm_is_truncated_threshold": num(th)}))
        loss.backward()
        out = {"pg_loss": m["pg_loss"], "grad_log_prob": x.grad, "clip_ratio": m["clip_ratio"], "ppo_kl": m["ppo_kl"]}
        if "vllm_kl" in m:
            out["vllm_kl"] = m["vllm_kl"]
        return out
    if preset == "nemo_rl":
        if rollout is None:
            reject("policy_loss", "rollout_log_prob", "nemo_rl needs the input rollout_log_prob")
        loss, m = ulorl.presets.nemo_rl.clipped_pg_loss(
            x, old, adv, mask, generation_logprobs=rollout, ratio_clip_min=p(params, "ratio_clip_min", 0.2),
            ratio_clip_max=p(params, "ratio_clip_max", 0.2), ratio_clip_c=params.get("ratio_clip_c"),
            token_level_loss=p(params, "token_level_loss", True),
            force_on_policy_ratio=p(params, "force_on_policy_ratio", False),
            disable_ppo_ratio=p(params, "disable_ppo_ratio", False),
            use_importance_sampling_correction=p(params, "use_importance_sampling_correction", False),
            truncated_importance_sampling_type=params.get("truncated_importance_sampling_type"),
            truncated_importance_sampling_ratio=params.get("truncated_importance_sampling_ratio"),
            truncated_importance_sampling_ratio_min=params.get("truncated_importance_sampling_ratio_min"),
            reference_policy_logprobs=ref,
            reference_policy_kl_penalty=p(params, "reference_policy_kl_penalty", 0.01),
            reference_policy_kl_type=p(params, "reference_policy_kl_type", "k3"),
            kl_input_clamp_value=params.get("kl_input_clamp_value"),
            kl_output_clamp_value=params.get("kl_output_clamp_value"),
            use_on_policy_kl_approximation=p(params, "use_on_policy_kl_approximation", False),
            global_valid_toks=params.get("global_valid_toks"), global_valid_seqs=params.get("global_valid_seqs"))
        loss.backward()
        out = {"pg_loss": loss.item(), "grad_log_prob": x.grad}
        for k in ("probs_ratio", "probs_ratio_clamped", "sampling_importance_ratio", "is_oob_ratio", "kl_penalty"):
            if k in m:
                out[k] = m[k]
        return out
    pytest.fail(f"unknown policy_loss preset {preset}")


def run_trl_grpo_loss(preset, params, inputs):
    if preset != "trl":
        reject("trl_grpo_loss", "preset", f"unknown preset '{preset}'")
    lp, old, mask = (t64(inputs[k]) for k in ("per_token_logps", "old_per_token_logps", "completion_mask"))
    adv = t64(inputs["advantages"])
    ref = opt64(inputs, "ref_per_token_logps")
    same_shape("trl_grpo_loss", "completion_mask", mask, "per_token_logps", lp)
    beta = p(params, "beta", 0.0)
    level = p(params, "importance_sampling_level", "token")
    loss_type = p(params, "loss_type", "dapo")
    entropy_coef = p(params, "entropy_coef", 0.0)
    ent = opt64(inputs, "entropies")
    ent = ent.requires_grad_() if ent is not None else None
    x = lp.clone().requires_grad_()
    loss, m = ulorl.presets.trl.grpo_loss(
        x, old, adv, mask, ref_per_token_logps=ref, loss_type=loss_type,
        epsilon=p(params, "epsilon", 0.2), epsilon_high=params.get("epsilon_high"), delta=params.get("delta"),
        beta=beta, importance_sampling_level=level, use_bias_correction_kl=p(params, "use_bias_correction_kl", False),
        max_completion_length=params.get("max_completion_length"),
        gradient_accumulation_steps=p(params, "gradient_accumulation_steps", 1),
        num_items_in_batch=params.get("num_items_in_batch"), num_processes=p(params, "num_processes", 1),
        sapo_temperature_pos=p(params, "sapo_temperature_pos", 1.0),
        sapo_temperature_neg=p(params, "sapo_temperature_neg", 1.05),
        vespo_k_pos=p(params, "vespo_k_pos", 2.0), vespo_lambda_pos=p(params, "vespo_lambda_pos", 3.0),
        vespo_k_neg=p(params, "vespo_k_neg", 3.0), vespo_lambda_neg=p(params, "vespo_lambda_neg", 2.0),
        off_policy_mask_threshold=params.get("off_policy_mask_threshold"),
        top_entropy_quantile=p(params, "top_entropy_quantile", 1.0), entropy_coef=entropy_coef, entropies=ent,
        sampling_per_token_logps=opt64(inputs, "sampling_per_token_logps"),
        importance_sampling_ratio=opt64(inputs, "importance_sampling_ratio"))
    loss.backward()
    out = {"loss": loss.item(), "grad_per_token_logps": x.grad}
    for ours, theirs in (("clip_ratio_low_mean", "clip_ratio/low_mean"), ("clip_ratio_high_mean", "clip_ratio/high_mean"),
                         ("clip_ratio_region_mean", "clip_ratio/region_mean"), ("cispo_clip_ratio", "cispo_clip_ratio"),
                         ("vespo_phi_seq_mean", "vespo_phi_seq_mean"), ("entropy_mean", "entropy")):
        if theirs in m:
            out[ours] = m[theirs]
    if beta != 0.0:
        out["kl_mean"] = m["kl"]
    if entropy_coef != 0.0:
        out["grad_entropies"] = ent.grad
    return out


def run_advantage(preset, params, inputs):
    est = p(params, "estimator", "grpo")
    rewards, mask = t64(inputs["token_level_rewards"]), t64(inputs["response_mask"])
    same_shape("advantage", "response_mask", mask, "token_level_rewards", rewards)
    scores = rewards.sum(-1)  # verl's convention: every position of the row (ulorl/advantage/scores.hpp)
    comps = opt64(inputs, "reward_components")
    weights = params.get("reward_weights")
    index = ints(inputs["index"]) if "index" in inputs else None
    if preset == "verl" and est not in ("grpo", "rloo"):
        if est == "gpg":
            adv = ulorl.gpg_advantages(scores, index, f_norm=p(params, "f_norm", 1.0))
            return {"advantages": ulorl.broadcast_to_tokens(adv, mask, "verl")}
        if est == "opo":
            return {"advantages": ulorl.broadcast_to_tokens(ulorl.opo_advantages(scores, mask, index), mask, "verl")}
        if est == "gdpo":
            return {"advantages": ulorl.multi_reward_advantages(
                comps, mask, index, preset="verl", reward_weights=weights, epsilon=p(params, "epsilon", 1e-6),
                norm_adv_by_std=p(params, "norm_adv_by_std_in_grpo", True))}
        if est in ("optimal_token_baseline", "tir_optimal_token_baseline"):
            adv, ret = ulorl.optimal_token_baseline_advantages(
                rewards, mask, index, old_log_prob=opt64(inputs, "old_log_probs"),
                sum_pi_squared=opt64(inputs, "sum_pi_squared"), rollout_is_weights=opt64(inputs, "rollout_is_weights"),
                estimator=est, handle_zero_tail=p(params, "handle_zero_tail", True), epsilon=p(params, "epsilon", 1e-8))
            return {"advantages": adv, "returns": ret}
        if est == "reinforce_plus_plus":
            adv, ret = ulorl.reinforce_plus_plus_advantages(rewards, mask, gamma=p(params, "gamma", 1.0))
            return {"advantages": adv, "returns": ret}
        if est == "reinforce_plus_plus_baseline":
            return {"advantages": ulorl.reinforce_plus_plus_baseline_advantages(scores, mask, index, preset="verl")}
        reject("advantage", "estimator", f"unknown verl estimator '{est}'")
    if preset == "nemo_rl" and est == "gdpo":
        return {"advantages": ulorl.multi_reward_advantages(
            comps, mask, index, preset="nemo_rl", reward_weights=weights,
            use_leave_one_out_baseline=p(params, "use_leave_one_out_baseline", True),
            normalize_rewards=p(params, "normalize_rewards", True))}
    if preset == "nemo_rl" and est == "reinforce_plus_plus":
        return {"advantages": ulorl.reinforce_plus_plus_baseline_advantages(
            scores, mask, index, preset="nemo_rl", minus_baseline=p(params, "minus_baseline", True))}
    if preset == "trl":
        agg = p(params, "multi_objective_aggregation", "sum_then_normalize")
        if comps is not None or agg != "sum_then_normalize":
            # Several reward functions (normalize_then_sum without components is rejected by the library).
            if comps is None:
                comps = torch.zeros(rewards.shape[0], 0, dtype=torch.float64)
            return {"advantages": ulorl.multi_reward_advantages(
                comps, mask, group_size=p(params, "num_generations", 0), preset="trl", reward_weights=weights,
                scale_rewards=p(params, "scale_rewards", "group"), multi_objective_aggregation=agg)}
    ids, size, kw = None, None, {}
    if preset == "verl":
        ids = index
        kw = dict(estimator=est, epsilon=p(params, "epsilon", 1e-6),
                  norm_adv_by_std=p(params, "norm_adv_by_std_in_grpo", True))
    elif preset == "trl":
        size, kw = p(params, "num_generations", 0), dict(scale_rewards=p(params, "scale_rewards", "group"))
    elif preset == "openrlhf":
        size, kw = p(params, "n_samples_per_prompt", 0), dict(estimator=est)
    elif preset == "nemo_rl":
        ids = index
        kw = dict(use_leave_one_out_baseline=p(params, "use_leave_one_out_baseline", True),
                  normalize_rewards=p(params, "normalize_rewards", True))
    elif preset == "open_instruct":
        size, kw = p(params, "num_samples_per_prompt_rollout", 0), dict(estimator=est)
    preset_obj = ulorl.advantage_preset(preset, **kw)
    adv = ulorl.group_advantages(scores, ids, preset_obj, group_size=size)
    return {"advantages": ulorl.broadcast_to_tokens(adv, mask, preset_obj)}


def run_agg_loss(preset, params, inputs):
    loss_mat, mask = t64(inputs["loss_mat"]), t64(inputs["loss_mask"])
    x = loss_mat.clone().requires_grad_()
    common = dict(dp_size=p(params, "dp_size", 1.0), batch_num_tokens=params.get("batch_num_tokens"),
                  global_batch_size=params.get("global_batch_size"))
    if preset == "verl":
        loss = ulorl.presets.verl.agg_loss(x, mask, p(params, "loss_agg_mode", "token-mean"),
                                           loss_scale_factor=params.get("loss_scale_factor"),
                                           sum_norm_per_sequence=False, **common)
    elif preset == "openrlhf":
        loss = ulorl.presets.openrlhf.agg_loss(x, mask, token_level_loss=p(params, "token_level_loss", True), **common)
    else:
        reject("agg_loss", "preset", f"unknown preset '{preset}'")
    loss.backward()
    return {"loss": loss.item(), "grad_loss_mat": x.grad}


def run_kl_penalty(preset, params, inputs):
    lp, ref = t64(inputs["logprob"]), t64(inputs["ref_logprob"])
    x = lp.clone().requires_grad_()
    if preset == "verl":
        kl = ulorl.presets.verl.kl_penalty(x, ref, p(params, "kl_penalty", "kl"))
    elif preset == "openrlhf":
        kl = ulorl.presets.openrlhf.compute_approx_kl(x, ref, p(params, "kl_estimator", "k1"))
    elif preset == "nemo_rl":
        kl = ulorl.presets.nemo_rl.calculate_kl(x, ref, p(params, "kl_type", "k3"), params.get("input_clamp_value"),
                                                params.get("output_clamp_value"))
    else:
        reject("kl_penalty", "preset", f"unknown preset '{preset}'")
    kl.sum().backward()
    return {"kl": kl.detach(), "grad_logprob": x.grad}


def run_rollout_correction(preset, params, inputs):
    old, ro, mask = (t64(inputs[k]) for k in ("old_log_prob", "rollout_log_prob", "response_mask"))
    if preset == "verl":
        w, keep, m = ulorl.presets.verl.rollout_correction(
            old, ro, mask, rollout_is=params.get("rollout_is"), rollout_is_threshold=params.get("rollout_is_threshold"),
            rollout_is_batch_normalize=p(params, "rollout_is_batch_normalize", False),
            rollout_rs=params.get("rollout_rs"), rollout_rs_threshold=params.get("rollout_rs_threshold"))
        out = dict(m, mask=keep)
        if w is not None:
            out["weights"] = w
        return out
    if preset == "trl":
        # A missing key is the framework's default; null is "no bound".
        w, m = ulorl.presets.trl.rollout_correction(
            old, ro, mask, vllm_importance_sampling_mode=p(params, "vllm_importance_sampling_mode", "sequence_mask"),
            vllm_importance_sampling_clip_min=params.get("vllm_importance_sampling_clip_min"),
            vllm_importance_sampling_clip_max=params.get("vllm_importance_sampling_clip_max", 3.0))
        return dict(m, weights=w)
    if preset == "openrlhf":
        th = params.get("vllm_is_truncated_threshold")
        w, m = ulorl.presets.openrlhf.rollout_correction(
            old, ro, mask, vllm_is_correction_type=p(params, "vllm_is_correction_type", "tis"),
            **({} if th is None else {"vllm_is_truncated_threshold": num(th)}))
        return dict(m, weights=w)
    if preset == "nemo_rl":
        w, m = ulorl.presets.nemo_rl.rollout_correction(
            old, ro, mask, truncated_importance_sampling_type=params.get("truncated_importance_sampling_type"),
            truncated_importance_sampling_ratio=params.get("truncated_importance_sampling_ratio"),
            truncated_importance_sampling_ratio_min=params.get("truncated_importance_sampling_ratio_min"),
            sequence_level_importance_ratios=p(params, "sequence_level_importance_ratios", False),
            global_valid_toks=params.get("global_valid_toks"), global_valid_seqs=params.get("global_valid_seqs"))
        return dict(m, weights=w)
    reject("rollout_correction", "preset", f"unknown preset '{preset}'")


def run_off_policy_mask(preset, params, inputs):
    if params.get("delta") is None:
        reject("off_policy_mask", "delta", "must be given")
    lp, old, mask, adv = (t64(inputs[k]) for k in ("log_prob", "old_log_prob", "response_mask", "advantages"))
    keep, seq_kl, stats = ulorl.off_policy_mask(lp, old, adv, mask, delta=params["delta"], preset=preset)
    out = {"mask": keep, "seq_kl": seq_kl}
    if preset == "slime":
        out["opsm_clipfrac"] = stats["opsm_clipfrac"]
    return out


def run_entropy_controller(preset, params, inputs):
    if preset != "trl":
        reject("entropy_controller", "preset", f"unknown preset '{preset}'")
    names = ("entropy_coef", "entropy_target", "entropy_coef_delta", "entropy_coef_min", "entropy_coef_max")
    ctl = ulorl.presets.trl.adaptive_entropy_controller(**{k: params[k] for k in names if params.get(k) is not None})
    values, applied = [], []
    for e in num(inputs["entropy"]):
        applied.append(ctl.bonus())
        values.append(ctl.update(e))
    return {"values": values, "applied": applied}


def run_overlong_penalty(preset, params, inputs):
    if preset == "dapo":
        lengths, scores = num(inputs["response_length"]), t64(inputs["scores"])
        if len(lengths) != len(scores):
            reject("overlong_penalty", "scores", f"has {len(scores)} elements but 'response_length' has {len(lengths)}")
        pen = ulorl.overlong_penalty(lengths, "dapo", max_length=p(params, "max_resp_len", 0),
                                     buffer_length=p(params, "overlong_buffer_len", 0),
                                     penalty_factor=p(params, "penalty_factor", 1.0))
        return {"penalty": pen, "reward": scores + torch.from_numpy(pen)}
    assert preset == "trl"
    pen = ulorl.overlong_penalty(num(inputs["completion_length"]), "trl", max_length=p(params, "max_completion_len", 0),
                                 cache_length=p(params, "soft_punish_cache", 0))
    return {"penalty": pen}


def run_logits_stats(preset, params, inputs):
    logits = t64(inputs["logits"]).requires_grad_()
    labels = ints(inputs["labels"])
    g_lp, g_ent = t64(inputs["grad_logprob"]), t64(inputs["grad_entropy"])
    lp, ent = ulorl.logprobs_from_logits(logits, labels, temperature=p(params, "temperature", 1.0), check_values=True)
    if not (torch.isfinite(g_lp).all() and torch.isfinite(g_ent).all()):
        reject("logits_stats", "grad_logprob", "upstream gradients must be finite")
    (lp * g_lp + ent * g_ent).sum().backward()
    _, _, lse = ulorl.logits_statistics(logits, labels, temperature=p(params, "temperature", 1.0))
    return {"logprob": lp, "entropy": ent, "grad_logits": logits.grad, "lse": lse}


def run_kl_controller(preset, params, inputs):
    assert preset in ("verl", "openrlhf")
    k = ulorl.KLController(type=p(params, "type", "fixed"), init_coef=p(params, "kl_coef", 0.001),
                           target_kl=p(params, "target_kl", 0.1), horizon=p(params, "horizon", 10000.0))
    kl, n = num(inputs["current_kl"]), inputs["n_steps"]
    if len(kl) != len(n):
        reject("kl_controller", "n_steps", f"has {len(n)} elements but 'current_kl' has {len(kl)}")
    return {"values": [k.update(a, int(b)) for a, b in zip(kl, n)]}


RUNNERS = {"policy_loss": run_policy_loss, "trl_grpo_loss": run_trl_grpo_loss, "advantage": run_advantage,
           "overlong_penalty": run_overlong_penalty, "logits_stats": run_logits_stats,
           "kl_controller": run_kl_controller, "agg_loss": run_agg_loss, "kl_penalty": run_kl_penalty,
           "rollout_correction": run_rollout_correction, "off_policy_mask": run_off_policy_mask,
           "entropy_controller": run_entropy_controller}


def close_enough(actual, expected, rtol, atol, path):
    if isinstance(expected, list):
        a = actual.tolist() if hasattr(actual, "tolist") else actual
        assert isinstance(a, list) and len(a) == len(expected), f"{path}: shape differs"
        for i, (x, e) in enumerate(zip(a, expected)):
            close_enough(x, e, rtol, atol, f"{path}[{i}]")
        return
    a = float(actual)
    e = num(expected)
    assert math.isfinite(a) and abs(a - e) <= atol + rtol * abs(e), f"{path}: got {a!r}, expected {e!r}"


@pytest.mark.parametrize("path", CASES, ids=[os.path.basename(c)[:-5] for c in CASES])
def test_golden_case(path):
    with open(path) as f:
        case = json.load(f)
    op = case["op"]
    run = RUNNERS[op]
    preset, params, inputs = case.get("preset") or "", case.get("params") or {}, case.get("inputs") or {}
    expected = case["expected"]
    if expected.get("error") is True:
        with pytest.raises(ulorl.Error):
            run(preset, params, inputs)
        return
    out = run(preset, params, inputs)
    tol = case["tolerance"]
    rtol, atol = num(tol.get("rtol", 1e-6)), num(tol.get("atol", 1e-9))
    for key, value in expected.items():
        assert key in out, f"missing output '{key}'"
        close_enough(out[key], value, rtol, atol, key)


def test_golden_cases_present():
    assert len(CASES) >= 100, golden_dir()
