"""Type stubs of the compiled module ulorl._ulorl (python/src/*.cpp). The public names are re-exported
by ``ulorl``; the underscored functions are the building blocks of ulorl._api and ulorl.presets."""

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union, overload

import numpy as np
import torch

class Error(ValueError):
    """ulorl::error: the message names the function, the argument, the offending index and value."""

    function: str
    argument: str
    index: int

#: The instruction set of the policy-loss kernels installed at import: the widest of "avx512"
#: (x86-64 with AVX-512 F/BW/DQ/VL and FMA), "avx2" (AVX2 and FMA) and "default" (the extension's
#: baseline flags) that the CPU runs, at most the one ULORL_PYTHON_ISA names (default, avx2, avx512).
policy_loss_isa: str
#: Whether the extension was built with the CUDA kernels of the policy loss, the logits statistics,
#: the loss from logits and the linear head (against a torch with CUDA and nvcc); the other
#: operators run CUDA tensors on the CPU there (set_host_fallback); without them a CUDA tensor is an
#: error unless set_host_fallback(True).
cuda_kernels: bool
#: The same for the logits kernels (logits_forward / logits_backward: logits statistics, the fused
#: losses from logits and from hidden states), chosen with policy_loss_isa (the same value).
logits_isa: str

def set_host_fallback(enabled: bool) -> bool: ...
def host_fallback() -> bool: ...

class BatchCounts:
    tokens: float
    sequences: float
    rows: float
    def __init__(self, tokens: float = 0.0, sequences: float = 0.0, rows: float = 0.0) -> None: ...
    def __add__(self, other: BatchCounts) -> BatchCounts: ...
    def to_list(self) -> List[float]: ...
    @staticmethod
    def from_list(values: Sequence[float]) -> BatchCounts: ...

class Normalizer:
    mode: str
    denominator: float
    scale: float
    def __init__(self, mode: str, denominator: float, scale: float = 1.0) -> None: ...

def global_normalizer(mode: str, counts: BatchCounts, constant: float = 0.0, scale: float = 1.0) -> Normalizer: ...
def count_batch(mask: Optional[torch.Tensor] = None, offsets: Optional[torch.Tensor] = None, *,
                tokens: Optional[torch.Tensor] = None) -> BatchCounts: ...

class PolicyLossConfig:
    objective: str
    eps_low: float
    eps_high: float
    dual_clip: float
    delta: float
    log_ratio_clamp: float
    seq_log_ratio_max: float
    seq_gradient: str
    tau_pos: float
    tau_neg: float
    kl_estimator: str
    kl_straight_through: bool
    kl_input_clamp: float
    kl_output_clamp: float
    kl_importance_weighted: bool
    abs_penalty: float
    surrogate: str
    square_penalty: float
    kl_coef: float
    entropy_coef: float
    normalizer: Normalizer
    check_values: bool
    rollout: Optional[RolloutCorrectionConfig]
    rollout_batch_norm_factor: Optional[float]
    def __init__(self) -> None: ...
    def __copy__(self) -> PolicyLossConfig: ...

class PolicyLossResult:
    loss: float
    pg_loss: float
    kl_loss: float
    entropy_loss: float
    rollout: RolloutCorrectionStatistics
    def as_dict(self) -> Dict[str, float]: ...

class AdvantagePreset:
    """How advantages are computed and reach the tokens (ulorl/presets/<framework>.hpp)."""

    group_config: List[float]  # the float[] config of torch.ops.ulorl.group_advantages
    broadcast_config: List[float]  # the float[] config of torch.ops.ulorl.broadcast_to_tokens

class RolloutCorrectionConfig:
    """A validated rollout-correction configuration (ulorl::rollout_correction::config)."""

    importance_weights: bool
    rejection_sampling: bool
    batch_normalize: bool
    encoded: List[float]  # the float[] config of torch.ops.ulorl.rollout_correction

class RolloutCorrectionMetrics:
    def as_dict(self) -> Dict[str, float]: ...

class RolloutCorrectionStatistics:
    rows: float
    tokens: float
    rejected_tokens: float
    def __init__(self) -> None: ...
    def __add__(self, other: RolloutCorrectionStatistics) -> RolloutCorrectionStatistics: ...

def rollout_correction_finalize(statistics: RolloutCorrectionStatistics,
                                config: RolloutCorrectionConfig) -> Dict[str, float]: ...

class NemoRLClippedPGLossOptions:
    ratio_clip_min: float
    ratio_clip_max: float
    ratio_clip_c: Optional[float]
    token_level_loss: bool
    force_on_policy_ratio: bool
    disable_ppo_ratio: bool
    use_importance_sampling_correction: bool
    truncated_importance_sampling_type: Optional[str]
    truncated_importance_sampling_ratio: Optional[float]
    truncated_importance_sampling_ratio_min: Optional[float]
    reference_policy_kl_penalty: float
    reference_policy_kl_type: str
    kl_input_clamp_value: Optional[float]
    kl_output_clamp_value: Optional[float]
    use_on_policy_kl_approximation: bool
    sequence_level_importance_ratios: bool
    use_cispo: bool
    positive_example_nll_weight: float
    encoded: List[float]  # the float[] options of torch.ops.ulorl.nemo_rl_logged_ratios
    def __init__(self) -> None: ...

class TRLGRPOLossOptions:
    loss_type: str
    epsilon: float
    epsilon_high: Optional[float]
    delta: Optional[float]
    beta: float
    importance_sampling_level: str
    use_bias_correction_kl: bool
    max_completion_length: float
    gradient_accumulation_steps: float
    num_items_in_batch: Optional[float]
    num_processes: float
    sapo_temperature_pos: float
    sapo_temperature_neg: float
    vespo_k_pos: float
    vespo_lambda_pos: float
    vespo_k_neg: float
    vespo_lambda_neg: float
    off_policy_mask_threshold: Optional[float]
    top_entropy_quantile: float
    entropy_coef: float
    check_values: bool
    encoded: List[float]  # the float[] config of torch.ops.ulorl.trl_grpo_loss
    def __init__(self) -> None: ...

class TRLAdaptiveEntropyParams:
    entropy_coef: float
    entropy_target: float
    entropy_coef_delta: float
    entropy_coef_min: float
    entropy_coef_max: float
    def __init__(self) -> None: ...

class LigerFusedLinearGRPOOptions:
    uses_num_items: bool
    beta: float
    use_ref_model: bool
    epsilon_low: float
    epsilon_high: float
    loss_type: str
    max_completion_length: Optional[float]
    importance_sampling_level: str
    sapo_temperature_pos: float
    sapo_temperature_neg: float
    temperature: float
    delta: Optional[float]
    use_bias_correction_kl: bool
    vespo_k_pos: float
    vespo_lambda_pos: float
    vespo_k_neg: float
    vespo_lambda_neg: float
    def __init__(self) -> None: ...

class KLController:
    value: float
    updates: int
    last_kl: float
    last_error: float
    def __init__(self, *, type: str = "fixed", init_coef: float = 0.001, target_kl: float = 0.1,
                 horizon: float = 10000.0, max_error: float = 0.2, min_coef: float = 0.0,
                 max_coef: float = 1e6) -> None: ...
    def update(self, current_kl: float, n_steps: int) -> float: ...
    def save(self) -> bytes: ...
    @staticmethod
    def restore(data: bytes) -> KLController: ...

class EntropyController:
    value: float
    updates: int
    last_entropy: float
    def __init__(self, *, rule: str = "step", target_entropy: float = 0.2, init_coef: float = 0.0,
                 step_up: float = 0.005, step_down: float = 0.005, gain: float = 0.05, tolerance: float = 0.0,
                 min_coef: float = 0.0, max_coef: float = 0.1, gate_above_target: bool = True) -> None: ...
    @overload
    def bonus(self, entropy: float) -> float: ...
    @overload
    def bonus(self) -> float: ...
    def update(self, entropy: float) -> float: ...
    def save(self) -> bytes: ...
    @staticmethod
    def restore(data: bytes) -> EntropyController: ...

class ReferenceResetPolicy:
    cooldown_remaining: int
    resets: int
    best: Optional[float]
    def __init__(self, *, every_n_steps: int = 0, on_plateau: bool = True, patience: int = 5, min_delta: float = 0.0,
                 higher_is_better: bool = True, on_drop: bool = False, max_drop: float = 0.05,
                 on_kl_share: bool = False, max_kl_share: float = 0.5, kl_share_patience: int = 1,
                 cooldown_steps: int = 0, manual_ignores_cooldown: bool = False,
                 reset_optimizer: bool = True) -> None: ...
    def observe_step(self, step: int, kl_term: float, policy_term: float) -> Dict[str, Any]: ...
    def observe_validation(self, step: int, metric: float) -> Dict[str, Any]: ...
    def request_manual(self, step: int) -> Dict[str, Any]: ...
    def save(self) -> bytes: ...
    @staticmethod
    def restore(data: bytes) -> ReferenceResetPolicy: ...

def kl_share(kl_term: float, policy_term: float) -> float: ...

class PlanItem:
    response_id: int
    group_id: int
    index_in_group: int
    start_token: int
    max_new_tokens: int
    policy_version: int

Span = Tuple[int, int, int]

class SegmentScheduler:
    step: int
    policy_version: int
    phase: str
    active_responses: int
    queued_groups: int
    live_groups: int
    ready_groups: int
    live_tokens: int
    segment_tokens: int
    counters: Dict[str, int]
    def __init__(self, *, group_size: int = 8, max_response_tokens: int = 65536, num_segments: int = 4,
                 max_active_responses: int = 1024, max_decode_tokens: int = 0, max_new_groups_per_step: int = 0,
                 order: str = "completion", release_batch_groups: int = 0, max_staleness: int = -1,
                 on_stale: str = "recompute") -> None: ...
    def offer_prompts(self, n: int) -> int: ...
    def plan(self) -> Dict[str, Any]: ...
    def current_plan(self) -> List[PlanItem]: ...
    def report(self, response_id: int, new_tokens: int, outcome: str) -> None: ...
    def abort(self, response_id: int) -> None: ...
    def end_step(self) -> Dict[str, int]: ...
    def update_policy(self, version: int) -> None: ...
    def set_num_segments(self, n: int) -> None: ...
    def take_experience(self, allow_partial: bool = False) -> Dict[str, Any]: ...
    def state_of(self, response_id: int) -> str: ...
    def spans_of(self, response_id: int) -> List[Span]: ...
    def tokens_of(self, response_id: int) -> int: ...
    def save(self) -> bytes: ...
    def restore(self, data: bytes) -> None: ...
    @staticmethod
    def from_bytes(data: bytes) -> SegmentScheduler: ...
    def to_json(self) -> str: ...

def old_log_prob_plan(spans: Sequence[Span], *, current_version: int, mode: str = "pois", max_staleness: int = -1,
                     trust_rollout_log_probs: bool = True) -> List[Tuple[int, int, int, bool]]: ...
def recompute_token_count(spans: Sequence[Span], *, current_version: int, mode: str = "pois",
                          max_staleness: int = -1, trust_rollout_log_probs: bool = True) -> int: ...
def old_log_prob_versions(spans: Sequence[Span], *, current_version: int, mode: str = "pois",
                         max_staleness: int = -1, trust_rollout_log_probs: bool = True) -> List[int]: ...

# The `ulorl` torch operators' encodings (ulorl/loss/fields.hpp) and registration at import:
# torch.ops.ulorl.policy_loss(log_prob, old_log_prob, advantages, mask, ref_log_prob, weights, entropy,
# offsets, rollout_log_prob, encode_fields(config)) -> (loss, result); torch.ops.ulorl.logits_statistics.
@overload
def encode_fields(config: PolicyLossConfig) -> List[float]: ...
@overload
def encode_fields(normalizer: Normalizer) -> List[float]: ...
def decode_result(result: torch.Tensor) -> PolicyLossResult: ...
def config_fields() -> List[str]: ...
def result_fields() -> List[str]: ...
def record_fields(record: str) -> List[str]: ...
def record_defaults(record: str) -> List[float]: ...

# Building blocks of ulorl._api and ulorl.presets.
def _policy_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
                 mask: Optional[torch.Tensor], config: PolicyLossConfig, ref_log_prob: Optional[torch.Tensor] = None,
                 weights: Optional[torch.Tensor] = None, entropy: Optional[torch.Tensor] = None,
                 offsets: Optional[torch.Tensor] = None,
                 rollout_log_prob: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, PolicyLossResult]: ...
def _logits_statistics_op(logits: torch.Tensor, labels: torch.Tensor, temperature: float, check_values: bool,
                  fast_backward: bool) -> Tuple[torch.Tensor, torch.Tensor]: ...
def _logits_statistics_torch_rounding(logits: torch.Tensor, labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]: ...
def _policy_loss_from_logits(*args: Any) -> Tuple[torch.Tensor, PolicyLossResult, torch.Tensor,
                                                   Optional[torch.Tensor]]: ...
def _linear_head_policy_loss(*args: Any) -> Tuple[torch.Tensor, PolicyLossResult, torch.Tensor,
                                                   Optional[torch.Tensor]]: ...
def _group_advantages(rewards: torch.Tensor, group_ids: Optional[torch.Tensor], group_size: Optional[int],
                      preset: AdvantagePreset) -> torch.Tensor: ...
def _broadcast_to_tokens(advantages: torch.Tensor, mask: Optional[torch.Tensor], preset: AdvantagePreset,
                         offsets: Optional[torch.Tensor] = None) -> torch.Tensor: ...
def _dynamic_sampling_filter(*args: Any) -> Tuple[torch.Tensor, Dict[str, int]]: ...
def _mpt_mask(*args: Any) -> Tuple[torch.Tensor, Dict[str, Any]]: ...
def _advantage_preset(*args: Any) -> AdvantagePreset: ...
def _custom_advantage(*args: Any) -> AdvantagePreset: ...
def _dapo_overlong_penalties(lengths: torch.Tensor, max_length: float, buffer_length: float,
                             penalty_factor: float) -> torch.Tensor: ...
def _soft_overlong_penalties(lengths: torch.Tensor, max_length: float, cache_length: float) -> torch.Tensor: ...
def _verl_config(*args: Any) -> PolicyLossConfig: ...
def _verl_metrics(loss_mode: str, result: PolicyLossResult, pg_clipfrac: float = 0.0, pg_clipfrac_lower: float = 0.0,
                  ppo_kl: float = 0.0) -> Dict[str, float]: ...
def _openrlhf_config(*args: Any) -> PolicyLossConfig: ...
def _rollout_correction_config(level: str, weighting: str, lower: float, upper: float, log_ratio_clamp: float,
                               overflow: str, masked: str, empty_rows: str, batch_normalize: bool,
                               rejection: Sequence[Tuple[str, str, float, float]], rejection_log_ratio_clamp: float,
                               diagnostic_log_ratio_clamp: float, reject_empty_batch: bool,
                               require_effective_sample_size: bool) -> RolloutCorrectionConfig: ...
def _rollout_correction(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: Optional[torch.Tensor],
                        config: RolloutCorrectionConfig, offsets: Optional[torch.Tensor] = None
                        ) -> Tuple[torch.Tensor, torch.Tensor, RolloutCorrectionMetrics]: ...
def _verl_rollout_correction_config(rollout_is: Optional[str], rollout_is_threshold: Union[float, str, None],
                                    rollout_is_batch_normalize: bool, rollout_rs: Optional[str],
                                    rollout_rs_threshold: Union[float, str, None]) -> RolloutCorrectionConfig: ...
def _trl_rollout_correction_config(vllm_importance_sampling_mode: str, vllm_importance_sampling_clip_min: Optional[float],
                                   vllm_importance_sampling_clip_max: Optional[float]) -> RolloutCorrectionConfig: ...
def _openrlhf_rollout_correction_config(vllm_is_correction_type: str,
                                        vllm_is_truncated_threshold: Sequence[float]) -> RolloutCorrectionConfig: ...
def _nemo_rl_rollout_correction_config(truncated_importance_sampling_type: Optional[str],
                                       truncated_importance_sampling_ratio: Optional[float],
                                       truncated_importance_sampling_ratio_min: Optional[float],
                                       sequence_level_importance_ratios: bool) -> RolloutCorrectionConfig: ...
def _nemo_rl_rollout_correction_logged(metrics: RolloutCorrectionMetrics, truncated_importance_sampling_type: Optional[str],
                                       sequence_level_importance_ratios: bool, global_valid_toks: Optional[float],
                                       global_valid_seqs: Optional[float],
                                       num_valid_samples: Optional[float] = None) -> Dict[str, float]: ...
def _gpg_advantages(scores: torch.Tensor, group_ids: Optional[torch.Tensor], group_size: Optional[int],
                    f_norm: float) -> torch.Tensor: ...
def _opo_advantages(scores: torch.Tensor, mask: torch.Tensor, group_ids: Optional[torch.Tensor],
                    group_size: Optional[int], offsets: Optional[torch.Tensor] = None) -> torch.Tensor: ...
def _reinforce_plus_plus_advantages(token_level_rewards: torch.Tensor, mask: Optional[torch.Tensor], gamma: float,
                             offsets: Optional[torch.Tensor] = None,
                             scan: str = "reset_after_eos") -> Tuple[torch.Tensor, torch.Tensor]: ...
def _gae_advantages(token_level_rewards: torch.Tensor, values: torch.Tensor, mask: Optional[torch.Tensor], gamma: float,
                    lam: float, offsets: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]: ...
def _remax_advantages(token_level_rewards: torch.Tensor, reward_baselines: torch.Tensor, mask: Optional[torch.Tensor],
                      offsets: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]: ...
def _pass_at_k_advantages(scores: torch.Tensor, group_ids: Optional[torch.Tensor], group_size: Optional[int],
                          epsilon: float, scale_by_std: bool) -> torch.Tensor: ...
def _reinforce_plus_plus_baseline_advantages(scores: torch.Tensor, group_ids: Optional[torch.Tensor], group_size: Optional[int],
                                      mask: torch.Tensor, preset: str, minus_baseline: bool,
                                      offsets: Optional[torch.Tensor] = None) -> torch.Tensor: ...
def _multi_reward_advantages(reward_components: torch.Tensor, reward_weights: Sequence[float],
                             group_ids: Optional[torch.Tensor], group_size: Optional[int], mask: torch.Tensor,
                             preset: str, epsilon: float, norm_adv_by_std: bool, use_leave_one_out_baseline: bool,
                             normalize_rewards: bool, scale_rewards: str, multi_objective_aggregation: str,
                             offsets: Optional[torch.Tensor] = None) -> torch.Tensor: ...
def _optimal_token_baseline_advantages(token_level_rewards: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor,
                                       old_log_prob: Optional[torch.Tensor], sum_pi_squared: Optional[torch.Tensor],
                                       rollout_is_weights: Optional[torch.Tensor], handle_zero_tail: bool,
                                       epsilon: float, estimator: str, offsets: Optional[torch.Tensor] = None
                                       ) -> Tuple[torch.Tensor, torch.Tensor]: ...
def _verl_normalizer(loss_agg_mode: str, counts: BatchCounts, dp_size: float, batch_num_tokens: Optional[float],
                     global_batch_size: Optional[float], loss_scale_factor: Optional[float],
                     padded_length: int) -> Normalizer: ...
def _openrlhf_normalizer(token_level_loss: bool, counts: BatchCounts, dp_size: float, batch_num_tokens: Optional[float],
                         global_batch_size: Optional[float]) -> Normalizer: ...
def _kl_config(preset: str, name: str, input_clamp: Optional[float], output_clamp: Optional[float]) -> List[float]: ...
def _kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, preset: str, name: str,
                input_clamp: Optional[float], output_clamp: Optional[float],
                offsets: Optional[torch.Tensor] = None) -> torch.Tensor: ...
def _agg_loss(loss_mat: torch.Tensor, mask: Optional[torch.Tensor], normalizer: Normalizer,
              offsets: Optional[torch.Tensor] = None) -> torch.Tensor: ...
def _off_policy_mask(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
                     mask: Optional[torch.Tensor], preset: str, delta: float, form: str,
                     offsets: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, Any]]: ...
def _verl_dppo_weights(loss_mode: str, clip_ratio_low: float, clip_ratio_high: float, clip_ratio_c: float,
                       old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                       mask: Optional[torch.Tensor], rollout_is_weights: Optional[torch.Tensor],
                       offsets: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Dict[str, float]]: ...
def _verl_kl_cov_selection(kl_cov_ratio: float, ppo_kl_coef: float, old_log_prob: torch.Tensor, log_prob: torch.Tensor,
                           advantages: torch.Tensor, mask: Optional[torch.Tensor],
                           rollout_is_weights: Optional[torch.Tensor], offsets: Optional[torch.Tensor] = None
                           ) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, float]]: ...
def _verl_clip_cov_weights(clip_ratio_low: float, clip_ratio_high: float, clip_cov_ratio: float, clip_cov_lb: float,
                           clip_cov_ub: float, old_log_prob: torch.Tensor, log_prob: torch.Tensor,
                           advantages: torch.Tensor, mask: Optional[torch.Tensor], clip_cov_selection: torch.Tensor,
                           rollout_is_weights: Optional[torch.Tensor], offsets: Optional[torch.Tensor] = None
                           ) -> Tuple[torch.Tensor, Dict[str, float]]: ...
def _openrlhf_vllm_is_plan(policy_loss_type: str, enable_vllm_is_correction: bool) -> Dict[str, bool]: ...
def _nemo_rl_validate(options: NemoRLClippedPGLossOptions) -> None: ...
def _nemo_rl_positive_example_nll(options: NemoRLClippedPGLossOptions,
                                  positive_tokens: float) -> Optional[Normalizer]: ...
def _nemo_rl_loss_config(options: NemoRLClippedPGLossOptions, counts: BatchCounts, global_valid_toks: Optional[float],
                         global_valid_seqs: Optional[float]) -> PolicyLossConfig: ...
def _nemo_rl_importance_config(options: NemoRLClippedPGLossOptions) -> RolloutCorrectionConfig: ...
def _nemo_rl_reference_policy_kl(options: NemoRLClippedPGLossOptions, log_prob: torch.Tensor,
                                 ref_log_prob: torch.Tensor, rollout_log_prob: Optional[torch.Tensor],
                                 mask: Optional[torch.Tensor], normalizer: Normalizer,
                                 offsets: Optional[torch.Tensor] = None) -> Tuple[float, float, torch.Tensor]: ...
def _nemo_rl_logged_ratios(options: NemoRLClippedPGLossOptions, log_prob: torch.Tensor, prev_log_prob: torch.Tensor,
                           mask: Optional[torch.Tensor], global_valid_toks: Optional[float],
                           offsets: Optional[torch.Tensor] = None) -> Dict[str, float]: ...
def _trl_grpo_loss(per_token_logps: torch.Tensor, old_per_token_logps: torch.Tensor, advantages: torch.Tensor,
                   completion_mask: Optional[torch.Tensor], ref_per_token_logps: Optional[torch.Tensor],
                   sampling_per_token_logps: Optional[torch.Tensor], entropies: Optional[torch.Tensor],
                   importance_sampling_ratio: Optional[torch.Tensor], options: TRLGRPOLossOptions
                   ) -> Tuple[torch.Tensor, Dict[str, float]]: ...
def _liger_validate(options: LigerFusedLinearGRPOOptions) -> None: ...
def _liger_fused_linear_grpo(options: LigerFusedLinearGRPOOptions, counts: BatchCounts,
                             num_items_in_batch: Optional[float], world_size: float) -> Dict[str, Any]: ...
def _trl_adaptive_entropy(params: TRLAdaptiveEntropyParams) -> EntropyController: ...
def _logits_statistics(logits: torch.Tensor, labels: torch.Tensor, temperature: float,
                       check_values: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...
