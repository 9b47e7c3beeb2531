"""The frameworks' Python drop-ins take their option defaults from the C++ presets' options structs
(read from default-made bound objects): every keyword default of these functions equals the C++
default of the option of the same name, and a keyword default the C++ struct does not hold is one of
the few listed here, so a default restated in Python (and drifting) fails."""

import dataclasses
import inspect

import pytest
import torch

import ulorl
from ulorl import _ulorl
from ulorl._api import _POLICY_LOSS_OPTIONS, _cpp_defaults
from ulorl.presets import liger, nemo_rl, trl

NEMO = _cpp_defaults(_ulorl.NemoRLClippedPGLossOptions)
GRPO = _cpp_defaults(_ulorl.TRLGRPOLossOptions)
ENTROPY = _cpp_defaults(_ulorl.TRLAdaptiveEntropyParams)
LIGER = _cpp_defaults(_ulorl.LigerFusedLinearGRPOOptions)

# Keyword defaults that are not options of the C++ struct: tensors and counts of the call (None),
# and the few Python-only ones, each with its reason.
NOT_OPTIONS = {
    "nemo_rl.clipped_pg_loss": {"check_values": _POLICY_LOSS_OPTIONS["check_values"]},
    # None: an error for dr_grpo rather than GRPOConfig's length.
    "trl.grpo_loss": {"max_completion_length": None},
    # Liger's arguments that change nothing in ulorl's head.
    "liger.liger_fused_linear_grpo": {"compiled": True, "chunk_size": 1, "num_items_in_batch": None},
    "liger.LigerFusedLinearGRPOLoss": {"compiled": True, "chunk_size": 1},
    "nemo_rl.ClippedPGLossConfig": {"use_kl_in_reward": False},
    "trl.adaptive_entropy_controller": {},
}

CASES = [
    ("nemo_rl.clipped_pg_loss", nemo_rl.clipped_pg_loss, NEMO),
    ("trl.grpo_loss", trl.grpo_loss, GRPO),
    ("trl.adaptive_entropy_controller", trl.adaptive_entropy_controller, ENTROPY),
    ("liger.liger_fused_linear_grpo", liger.liger_fused_linear_grpo, LIGER),
    ("liger.LigerFusedLinearGRPOLoss", liger.LigerFusedLinearGRPOLoss.__init__, LIGER),
]


def _defaults(f):
    return {n: p.default for n, p in inspect.signature(f).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _same(a, b):
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


@pytest.mark.parametrize("name,f,cpp", CASES, ids=[c[0] for c in CASES])
def test_keyword_defaults_are_the_cpp_defaults(name, f, cpp):
    defaults = _defaults(f)
    own = NOT_OPTIONS[name]
    for arg, value in defaults.items():
        if arg in own:
            assert _same(value, own[arg]), f"{name}({arg}=...): {value!r}, listed {own[arg]!r}"
        elif arg in cpp:
            assert _same(value, cpp[arg]), f"{name}({arg}=...): Python {value!r}, C++ {cpp[arg]!r}"
        else:
            assert value is None, f"{name}({arg}={value!r}): a default the C++ options do not hold"
    taken = [a for a in defaults if a in cpp]
    assert taken, f"{name} reads no C++ default"


def test_calculate_kl_defaults_are_the_cpp_kl_defaults():
    # calculate_kl's names for ClippedPGLossConfig's KL keys (one set of defaults, nemo_rl::defaults)
    names = {"kl_type": "reference_policy_kl_type", "input_clamp_value": "kl_input_clamp_value",
             "output_clamp_value": "kl_output_clamp_value"}
    defaults = _defaults(nemo_rl.calculate_kl)
    assert {k: defaults[k] for k in names} == {k: NEMO[v] for k, v in names.items()}
    assert defaults.keys() - names.keys() == {"importance_sampling_weights"}
    assert defaults["importance_sampling_weights"] is None


def test_clipped_pg_loss_config_fields_are_the_cpp_defaults():
    fields = {f.name: f.default for f in dataclasses.fields(nemo_rl.ClippedPGLossConfig)}
    for name, value in fields.items():
        want = NOT_OPTIONS["nemo_rl.ClippedPGLossConfig"][name] if name not in NEMO else NEMO[name]
        assert _same(value, want), f"ClippedPGLossConfig.{name}: Python {value!r}, C++ {want!r}"
    assert set(NEMO) <= set(fields), "C++ options without a ClippedPGLossConfig field"


def test_the_cpp_defaults_are_the_frameworks():
    # NeMo-RL ClippedPGLossConfig (nemo_rl/algorithms/loss/loss_functions.py)
    assert NEMO == {
        "ratio_clip_min": 0.2, "ratio_clip_max": 0.2, "ratio_clip_c": None, "token_level_loss": True,
        "force_on_policy_ratio": False, "disable_ppo_ratio": False, "use_importance_sampling_correction": False,
        "truncated_importance_sampling_type": None, "truncated_importance_sampling_ratio": None,
        "truncated_importance_sampling_ratio_min": None, "reference_policy_kl_penalty": 0.01,
        "reference_policy_kl_type": "k3", "kl_input_clamp_value": 20.0, "kl_output_clamp_value": 10.0,
        "use_on_policy_kl_approximation": False, "sequence_level_importance_ratios": False, "use_cispo": False,
        "positive_example_nll_weight": 0.0}
    # TRL GRPOConfig (the loss's fields; num_items_in_batch / num_processes / steps: one local process)
    for k, v in {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": None, "delta": None, "beta": 0.0,
                 "importance_sampling_level": "token", "use_bias_correction_kl": False, "sapo_temperature_pos": 1.0,
                 "sapo_temperature_neg": 1.05, "vespo_k_pos": 2.0, "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0,
                 "vespo_lambda_neg": 2.0, "off_policy_mask_threshold": None, "top_entropy_quantile": 1.0,
                 "entropy_coef": 0.0}.items():
        assert _same(GRPO[k], v), k
    assert ENTROPY == {"entropy_coef": 0.0, "entropy_target": 0.2, "entropy_coef_delta": 0.005,
                       "entropy_coef_min": 0.0, "entropy_coef_max": 1.0}
    # Liger LigerFusedLinearGRPOLoss; its SAPO / VESPO parameters are TRL's
    assert LIGER["beta"] == 0.04 and LIGER["epsilon_low"] == 0.2 and LIGER["epsilon_high"] == 0.2
    for k in ("loss_type", "importance_sampling_level", "sapo_temperature_pos", "sapo_temperature_neg",
              "use_bias_correction_kl", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"):
        assert _same(LIGER[k], GRPO[k]), k


def test_options_objects_round_trip_names_and_reject_unknown_ones():
    o = _ulorl.NemoRLClippedPGLossOptions()
    o.truncated_importance_sampling_type = "icepop"
    o.reference_policy_kl_type = "k2"
    assert o.truncated_importance_sampling_type == "icepop" and o.reference_policy_kl_type == "k2"
    o.truncated_importance_sampling_type = None
    assert o.truncated_importance_sampling_type is None
    t = _ulorl.TRLGRPOLossOptions()
    t.loss_type, t.importance_sampling_level = "vespo", "sequence_token"
    assert (t.loss_type, t.importance_sampling_level) == ("vespo", "sequence_token")
    with pytest.raises(ulorl.Error, match="loss_type"):
        t.loss_type = "bnpo2"
    with pytest.raises(ulorl.Error, match="importance_sampling_level"):
        _ulorl.LigerFusedLinearGRPOOptions().importance_sampling_level = "sequence_token"


def _nemo(**values):
    o = _ulorl.NemoRLClippedPGLossOptions()
    for k, v in values.items():
        setattr(o, k, v)
    return o


def test_nemo_rl_objective_is_the_cpp_presets_choice():
    counts = _ulorl.BatchCounts(4.0, 2.0, 2.0)

    def objective(**values):
        return _ulorl._nemo_rl_loss_config(_nemo(**values), counts, None, None)

    assert objective().objective == "ppo_clip"
    assert objective(use_cispo=True).objective == "cispo"
    gspo = objective(sequence_level_importance_ratios=True, token_level_loss=False)
    assert gspo.objective == "gspo" and gspo.seq_gradient == "through_mean" and gspo.seq_log_ratio_max == float("inf")
    assert objective(sequence_level_importance_ratios=True, token_level_loss=False,
                     force_on_policy_ratio=True).objective == "ppo_clip"
    assert objective(disable_ppo_ratio=True).objective == "policy_gradient"
    for bad in (dict(use_cispo=True, ratio_clip_c=3.0), dict(use_cispo=True, token_level_loss=False),
                dict(use_cispo=True, disable_ppo_ratio=True), dict(sequence_level_importance_ratios=True)):
        with pytest.raises(ulorl.Error):
            _ulorl._nemo_rl_validate(_nemo(**bad))


def test_nemo_rl_positive_example_nll_term_is_the_cpp_presets_choice():
    assert _ulorl._nemo_rl_positive_example_nll(_nemo(), 5.0) is None
    assert _ulorl._nemo_rl_positive_example_nll(_nemo(positive_example_nll_weight=0.5), 0.0) is None
    n = _ulorl._nemo_rl_positive_example_nll(_nemo(positive_example_nll_weight=0.5), 5.0)
    assert n.mode == "token_mean" and n.denominator == 5.0 and n.scale == -0.5


def test_clipped_pg_loss_defaults_put_the_kl_term_on():
    lp = -torch.rand(2, 3, dtype=torch.float64)
    mask = torch.ones(2, 3, dtype=torch.float64)
    adv = torch.randn(2, 3, dtype=torch.float64)
    with pytest.raises(ulorl.Error, match="reference_policy_logprobs"):
        nemo_rl.clipped_pg_loss(lp, lp, adv, mask)
    _, m = nemo_rl.clipped_pg_loss(lp, lp, adv, mask, reference_policy_logprobs=lp - 30.0)
    # the default clamps (20 / 10) bound the unscaled KL per token at 10
    assert m["kl_penalty"] == pytest.approx(10.0)
