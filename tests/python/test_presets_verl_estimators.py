"""verl's GAE, ReMax and Pass@k GRPO estimators (ulorl.presets.verl: compute_gae_advantage_return,
compute_remax_outcome_advantage, compute_grpo_passk_outcome_advantage) called in verl's forms against
the float64 oracles of oracles_verl.py: masks with observation spans inside a response, ties of the
Pass@k scores, groups of one rejected, verl's dtypes, the registry names; and the ulorl functions
behind them (ulorl.gae_advantages, remax_advantages, pass_at_k_advantages)."""

import types

import numpy as np
import pytest
import torch

import ulorl
import ulorl.presets.verl as v
import oracles_verl as O

SEED = 20250


def multi_turn(seed, B=6, T=11):
    """Rewards, values and a mask whose rows hold observation spans (0s between 1s) and padding."""
    g = torch.Generator().manual_seed(seed)
    m = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        n = int(torch.randint(2, T + 1, (1,), generator=g))
        m[b, :n] = 1
        if n > 4:
            at = int(torch.randint(1, n - 2, (1,), generator=g))
            m[b, at:at + int(torch.randint(1, n - at - 1, (1,), generator=g))] = 0
    r = torch.randn(B, T, generator=g, dtype=torch.float64) * (torch.rand(B, T, generator=g) < 0.4)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    return r, values, m


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.7, 0.3), (0.0, 0.5)])
def test_gae_matches_the_oracle_on_observation_spans(seed, gamma, lam):
    r, values, m = multi_turn(SEED + seed)
    adv, ret = v.compute_gae_advantage_return(r, values, m, gamma, lam)  # verl's positional form
    want_adv, want_ret = O.gae(r, values, m, gamma, lam)
    torch.testing.assert_close(ret, want_ret, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(adv, want_adv, rtol=1e-9, atol=1e-9)  # verl's mean divides by N + 1e-8
    adv_k, ret_k = v.compute_gae_advantage_return(token_level_rewards=r, values=values, response_mask=m,
                                                  gamma=torch.tensor(gamma, dtype=torch.float64),
                                                  lam=torch.tensor(lam, dtype=torch.float64))
    assert torch.equal(adv_k, adv) and torch.equal(ret_k, ret)


def test_gae_ignores_values_at_observation_tokens_and_keeps_verls_dtypes():
    r, values, m = multi_turn(SEED + 9)
    other = torch.where(m.bool(), values, values * 100 - 3)
    a1, r1 = v.compute_gae_advantage_return(r, values, m, 0.9, 0.8)
    a2, r2 = v.compute_gae_advantage_return(r, other, m, 0.9, 0.8)
    assert torch.equal(a1, a2) and torch.equal(r1 * m, r2 * m)
    a32, r32 = v.compute_gae_advantage_return(r.float(), values.float(), m.long(), 0.9, 0.8)
    assert a32.dtype == r32.dtype == torch.float32
    torch.testing.assert_close(a32.double(), a1, rtol=1e-4, atol=1e-4)
    a_mixed, _ = v.compute_gae_advantage_return(r.float(), values.float(), m, 0.9, 0.8)
    assert a_mixed.dtype == torch.float64  # a float64 mask promotes, as verl's arithmetic does
    with pytest.raises(ValueError):  # one valid token: no unbiased variance (verl: ValueError too)
        v.compute_gae_advantage_return(r[:1], values[:1], torch.eye(1, r.shape[1], dtype=torch.float64), 1.0, 1.0)


@pytest.mark.parametrize("seed", range(3))
def test_remax_matches_the_oracle(seed):
    r, _, m = multi_turn(SEED + 20 + seed)
    base = torch.randn(r.shape[0], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    adv, ret = v.compute_remax_outcome_advantage(r, base, m)
    want_adv, want_ret = O.remax(r, base, m)
    torch.testing.assert_close(ret, want_ret, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(adv, want_adv, rtol=1e-13, atol=1e-13)
    adv_k, ret_k = v.compute_remax_outcome_advantage(token_level_rewards=r, reward_baselines=base, response_mask=m,
                                                     config=None, extra="ignored")
    assert torch.equal(adv_k, adv) and torch.equal(ret_k, ret)
    a32, r32 = v.compute_remax_outcome_advantage(r.float(), base.float(), m.bool())
    assert a32.dtype == r32.dtype == torch.float32
    torch.testing.assert_close(a32.double(), adv, rtol=1e-5, atol=1e-5)
    a_mixed, r_mixed = v.compute_remax_outcome_advantage(r.float(), base, m.long())
    assert r_mixed.dtype == torch.float32 and a_mixed.dtype == torch.float64


PASSK_UIDS = np.array(["a", "a", "b", "b", "b", "c", "a", "c"], dtype=object)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("norm", [True, False])
def test_passk_matches_the_oracle_with_ties(seed, norm):
    g = torch.Generator().manual_seed(SEED + 40 + seed)
    m = (torch.rand(8, 5, generator=g) > 0.3).double()
    m[:, -1] = 1
    r = torch.zeros(8, 5, dtype=torch.float64)
    r[:, -1] = torch.randint(0, 3, (8,), generator=g).double() if seed % 2 == 0 else torch.randn(8, generator=g,
                                                                                                  dtype=torch.float64)
    cfg = types.SimpleNamespace(norm_adv_by_std_in_grpo=norm)
    adv, ret = v.compute_grpo_passk_outcome_advantage(r, m, PASSK_UIDS, config=cfg)
    want = O.pass_at_k(r.sum(-1), list(PASSK_UIDS), 1e-6, norm).unsqueeze(-1) * m
    torch.testing.assert_close(adv, want, rtol=1e-12, atol=1e-14)
    assert torch.equal(adv, ret)
    # as verl: the config decides the std scaling, the keyword does not
    adv_kw, _ = v.compute_grpo_passk_outcome_advantage(r, m, PASSK_UIDS, 1e-6, not norm, cfg)
    assert torch.equal(adv_kw, adv)
    a32, _ = v.compute_grpo_passk_outcome_advantage(r.float(), m.long(), PASSK_UIDS, config={})
    assert a32.dtype == torch.float32


def test_passk_rejects_singletons_and_a_missing_config():
    r = torch.ones(3, 2, dtype=torch.float64)
    m = torch.ones(3, 2, dtype=torch.float64)
    with pytest.raises(ValueError) as e:
        v.compute_grpo_passk_outcome_advantage(r, m, np.array([0, 0, 1]), config={})
    assert isinstance(e.value, ulorl.Error) and e.value.argument == "groups" and e.value.index == 2
    with pytest.raises(ulorl.Error):
        v.compute_grpo_passk_outcome_advantage(r, m, np.array([0, 0, 0]))


def test_the_registry_names_the_three_as_verls_enum_does():
    assert v.get_adv_estimator_fn("gae") is v.compute_gae_advantage_return
    assert v.get_adv_estimator_fn("remax") is v.compute_remax_outcome_advantage
    assert v.get_adv_estimator_fn("grpo_passk") is v.compute_grpo_passk_outcome_advantage


def test_the_ulorl_functions_behind_the_drop_ins():
    r, values, m = multi_turn(SEED + 60)
    adv, ret = ulorl.gae_advantages(r, values, m, gamma=0.9, lam=0.8)
    want_adv, want_ret = O.gae(r, values, m, 0.9, 0.8)
    torch.testing.assert_close(adv, want_adv, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ret, want_ret, rtol=1e-12, atol=1e-12)
    a_all, r_all = ulorl.gae_advantages(r, values, None, gamma=0.9, lam=0.8)  # absent mask: every token valid
    a_one, r_one = ulorl.gae_advantages(r, values, torch.ones_like(m), gamma=0.9, lam=0.8)
    assert torch.equal(a_all, a_one) and torch.equal(r_all, r_one)
    base = torch.linspace(-1, 1, r.shape[0], dtype=torch.float64)
    adv, ret = ulorl.remax_advantages(r, base, m)
    want_adv, want_ret = O.remax(r, base, m)
    torch.testing.assert_close(adv, want_adv, rtol=1e-13, atol=1e-13)
    s = torch.tensor([1.0, 3.0, 3.0, 0.0, 2.0, 5.0])
    out = ulorl.pass_at_k_advantages(s, group_size=3, scale_by_std=False)
    assert out.tolist() == [0.0, 0.0, 0.0, 0.0, 0.0, 3.0]
    torch.testing.assert_close(ulorl.pass_at_k_advantages(s, [0, 0, 0, 1, 1, 1]),
                               O.pass_at_k(s.double(), [0, 0, 0, 1, 1, 1]).float(), rtol=1e-6, atol=1e-7)
    with pytest.raises(ulorl.Error) as e:
        ulorl.pass_at_k_advantages(s, [0, 0, 0, 1, 1, 2])
    assert e.value.function == "pass_at_k_advantages" and e.value.argument == "groups"
