// Conformance ops `advantage` and `overlong_penalty` (golden README §4.1 with its added estimators, §4.8): JSON -> the public
// advantage API -> JSON. No formula lives here; presets come from ulorl/presets/<framework>.hpp.
#include <ulorl/advantage.hpp>
#include <ulorl/presets.hpp>

#include "conformance/registry.hpp"

namespace {

using namespace conformance;

struct batch {
  matrix rewards, mask;
  std::vector<std::int64_t> index;
};

batch read_batch(const json& in) {
  batch b{to_matrix(in.at("token_level_rewards"), "token_level_rewards"),
          to_matrix(in.at("response_mask"), "response_mask"),
          in.contains("index") ? to_ints(in["index"], "index") : std::vector<std::int64_t>{}};
  return b;
}

//! An optional [B][T] or [B][K] input: absent or null gives an empty matrix with `rows` rows.
matrix optional_matrix(const json& in, const char* name, std::size_t rows) {
  if (in.contains(name) && !in[name].is_null()) return to_matrix(in[name], name);
  return matrix{rows, 0, {}};
}
//! `reward_weights`: null or absent is empty (all 1).
std::vector<double> reward_weights(const json& params) {
  return has_param(params, "reward_weights") ? to_vector(params["reward_weights"], "reward_weights")
                                             : std::vector<double>{};
}
ulorl::matrix_view<const double> components_view(const matrix& m) {
  return ulorl::matrix_view<const double>(m.data.data(), m.rows, m.cols);
}
//! An optional per-token input as a view of the batch's shape (empty when absent).
ulorl::token_view<const double> optional_tokens(const matrix& m) {
  if (m.cols == 0) return {};
  ulorl::require_all_finite("advantage", "per-token input", padded_view(m));
  return padded_view(m);
}

json to_tokens(const batch& b, const std::vector<double>& adv, const ulorl::broadcast_config& placement) {
  matrix out{b.mask.rows, b.mask.cols, std::vector<double>(b.mask.data.size())};
  ulorl::broadcast_to_tokens(std::span<const double>(adv), padded_view(b.mask), padded_view(out), placement);
  return from_matrix(out);
}

json advantage(const std::string& preset, const json& params, const json& in) {
  const batch b = read_batch(in);
  const auto rewards = padded_view(b.rewards);
  const auto mask = padded_view(b.mask);
  ulorl::require_same_shape("advantage", "response_mask", mask, "token_level_rewards", rewards);
  ulorl::require_binary_mask("advantage", "response_mask", mask);
  std::vector<double> scores(b.rewards.rows), adv(b.rewards.rows);
  ulorl::response_scores(rewards, std::span<double>(scores));
  const std::string est = param_string(params, "estimator", "grpo");
  const auto by_index = [&] {
    ulorl::require_same_size("advantage", "index", b.index.size(), "token_level_rewards rows", scores.size());
    return ulorl::group_layout::from_ids(std::span<const std::int64_t>(b.index), "advantage", "index");
  };
  const auto fixed = [&](const char* name) {
    return ulorl::group_layout::fixed(scores.size(), static_cast<std::size_t>(param_int(params, name, 0, 0)),
                                      "advantage", name);
  };
  const auto run = [&](const ulorl::group_layout& g, const ulorl::advantage_preset& p) {
    ulorl::group_advantages(std::span<const double>(scores), g, std::span<double>(adv), p.group);
    return json{{"advantages", to_tokens(b, adv, p.broadcast)}};
  };

  if (preset == "verl") {
    const auto groups = by_index();
    if (est == "grpo")
      return run(groups, ulorl::presets::verl::grpo_advantage(
                             {.epsilon = param_double(params, "epsilon", 1e-6),
                              .norm_adv_by_std_in_grpo = param_bool(params, "norm_adv_by_std_in_grpo", true)}));
    if (est == "rloo") return run(groups, ulorl::presets::verl::rloo_advantage());
    const ulorl::broadcast_config masked{.placement = ulorl::token_placement::masked, .allow_empty_rows = true};
    if (est == "gpg") {
      ulorl::gpg_advantages(std::span<const double>(scores), groups, std::span<double>(adv),
                            {.f_norm = param_double(params, "f_norm", 1.0)});
      return json{{"advantages", to_tokens(b, adv, masked)}};
    }
    if (est == "opo") {
      std::vector<double> lengths(scores.size());
      for (std::size_t i = 0; i < lengths.size(); ++i) lengths[i] = static_cast<double>(ulorl::row_tokens(mask, i));
      ulorl::opo_advantages(std::span<const double>(scores), std::span<const double>(lengths), groups,
                            std::span<double>(adv));
      return json{{"advantages", to_tokens(b, adv, masked)}};
    }
    matrix out{b.mask.rows, b.mask.cols, std::vector<double>(b.mask.data.size())};
    const auto out_view = padded_view(out);
    if (est == "gdpo") {
      const matrix comp = optional_matrix(in, "reward_components", scores.size());
      const auto weights = reward_weights(params);
      ulorl::multi_reward_advantages(
          components_view(comp), std::span<const double>(weights), groups, mask, out_view,
          ulorl::presets::verl::gdpo_advantage(
              {.epsilon = param_double(params, "epsilon", 1e-6),
               .norm_adv_by_std_in_grpo = param_bool(params, "norm_adv_by_std_in_grpo", true)}));
      return json{{"advantages", from_matrix(out)}};
    }
    if (est == "optimal_token_baseline" || est == "tir_optimal_token_baseline") {
      const matrix lp = optional_matrix(in, "old_log_probs", scores.size());
      const matrix spp = optional_matrix(in, "sum_pi_squared", scores.size());
      const matrix rho = optional_matrix(in, "rollout_is_weights", scores.size());
      const ulorl::presets::verl::optimal_token_baseline_options o{
          .handle_zero_tail = param_bool(params, "handle_zero_tail", true),
          .epsilon = param_double(params, "epsilon", 1e-8)};
      matrix ret = out;
      ulorl::optimal_token_baseline_advantages(
          ulorl::optimal_token_baseline_inputs<double>{.token_rewards = rewards,
                                                       .mask = mask,
                                                       .old_log_prob = optional_tokens(lp),
                                                       .sum_pi_squared = optional_tokens(spp),
                                                       .rollout_is_weights = optional_tokens(rho)},
          groups, padded_view(ret), out_view,
          est == "optimal_token_baseline" ? ulorl::presets::verl::optimal_token_baseline_advantage(o)
                                          : ulorl::presets::verl::tir_optimal_token_baseline_advantage(o));
      return json{{"advantages", from_matrix(out)}, {"returns", from_matrix(ret)}};
    }
    if (est == "reinforce_plus_plus") {
      matrix ret = out;
      const auto ret_view = padded_view(ret);
      ulorl::reinforce_plus_plus_advantages(rewards, mask, ret_view, out_view, param_double(params, "gamma", 1.0));
      return json{{"advantages", from_matrix(out)}, {"returns", from_matrix(ret)}};
    }
    if (est == "reinforce_plus_plus_baseline") {
      ulorl::reinforce_plus_plus_baseline_advantages(std::span<const double>(scores), groups, mask, out_view);
      return json{{"advantages", from_matrix(out)}};
    }
  } else if (preset == "trl" && est == "grpo") {
    const std::string s = param_string(params, "scale_rewards", "group");
    if (s != "group" && s != "batch" && s != "none") throw reject("unknown scale_rewards '" + s + "'");
    const auto scale = s == "group"   ? ulorl::presets::trl::scale_rewards::group
                       : s == "batch" ? ulorl::presets::trl::scale_rewards::batch
                                      : ulorl::presets::trl::scale_rewards::none;
    const std::string agg = param_string(params, "multi_objective_aggregation", "sum_then_normalize");
    if (agg != "sum_then_normalize" && agg != "normalize_then_sum")
      throw reject("unknown multi_objective_aggregation '" + agg + "'");
    const bool has_components = in.contains("reward_components") && !in["reward_components"].is_null();
    if (!has_components && agg == "sum_then_normalize")
      return run(fixed("num_generations"), ulorl::presets::trl::advantage(scale));
    // Several reward functions (normalize_then_sum without components is rejected by the library).
    using A = ulorl::presets::trl::multi_objective_aggregation;
    const matrix comp = optional_matrix(in, "reward_components", scores.size());
    const auto weights = reward_weights(params);
    matrix out{b.mask.rows, b.mask.cols, std::vector<double>(b.mask.data.size())};
    ulorl::multi_reward_advantages(
        components_view(comp), std::span<const double>(weights), fixed("num_generations"), mask, padded_view(out),
        ulorl::presets::trl::multi_reward_advantage({.scale_rewards = scale,
                                                     .multi_objective_aggregation = agg == "normalize_then_sum"
                                                                                        ? A::normalize_then_sum
                                                                                        : A::sum_then_normalize}));
    return json{{"advantages", from_matrix(out)}};
  } else if (preset == "openrlhf") {
    using E = ulorl::presets::openrlhf::advantage_estimator;
    if (est == "group_norm" || est == "rloo" || est == "dr_grpo")
      return run(fixed("n_samples_per_prompt"), ulorl::presets::openrlhf::advantage(est == "group_norm" ? E::group_norm
                                                                                    : est == "rloo"     ? E::rloo
                                                                                                        : E::dr_grpo));
  } else if (preset == "nemo_rl" && est == "grpo") {
    return run(by_index(), ulorl::presets::nemo_rl::advantage(
                               {.use_leave_one_out_baseline = param_bool(params, "use_leave_one_out_baseline", true),
                                .normalize_rewards = param_bool(params, "normalize_rewards", true)}));
  } else if (preset == "nemo_rl" && est == "gdpo") {
    const matrix comp = optional_matrix(in, "reward_components", scores.size());
    const auto weights = reward_weights(params);
    matrix out{b.mask.rows, b.mask.cols, std::vector<double>(b.mask.data.size())};
    ulorl::multi_reward_advantages(
        components_view(comp), std::span<const double>(weights), by_index(), mask, padded_view(out),
        ulorl::presets::nemo_rl::gdpo_advantage(
            {.use_leave_one_out_baseline = param_bool(params, "use_leave_one_out_baseline", true),
             .normalize_rewards = param_bool(params, "normalize_rewards", true)}));
    return json{{"advantages", from_matrix(out)}};
  } else if (preset == "nemo_rl" && est == "reinforce_plus_plus") {
    matrix out{b.mask.rows, b.mask.cols, std::vector<double>(b.mask.data.size())};
    ulorl::reinforce_plus_plus_baseline_advantages(std::span<const double>(scores), by_index(), mask, padded_view(out),
                                                   ulorl::presets::nemo_rl::reinforce_plus_plus_advantage(
                                                       {.minus_baseline = param_bool(params, "minus_baseline", true)}));
    return json{{"advantages", from_matrix(out)}};
  } else if (preset == "open_instruct" && (est == "standard" || est == "centered")) {
    using N = ulorl::presets::open_instruct::advantage_normalization;
    return run(fixed("num_samples_per_prompt_rollout"),
               ulorl::presets::open_instruct::advantage(
                   {.advantage_normalization_type = est == "standard" ? N::standard : N::centered}));
  }
  throw reject("unknown preset/estimator '" + preset + "'/'" + est + "'");
}

json overlong_penalty(const std::string& preset, const json& params, const json& in) {
  if (preset == "dapo") {
    const auto lengths = to_vector(in.at("response_length"), "response_length");
    const auto scores = to_vector(in.at("scores"), "scores");
    ulorl::require_same_size("overlong_penalty", "scores", scores.size(), "response_length", lengths.size());
    std::vector<double> penalty(lengths.size()), reward(lengths.size());
    ulorl::dapo_overlong_penalties(std::span<const double>(lengths), std::span<double>(penalty),
                                   {.max_length = param_double(params, "max_resp_len", 0),
                                    .buffer_length = param_double(params, "overlong_buffer_len", 0),
                                    .penalty_factor = param_double(params, "penalty_factor", 1.0)});
    ulorl::require_all_finite("overlong_penalty", "scores",
                              ulorl::vector_view<const double>(std::span<const double>(scores)));
    for (std::size_t i = 0; i < reward.size(); ++i) reward[i] = scores[i] + penalty[i];
    return json{{"penalty", penalty}, {"reward", reward}};
  }
  if (preset == "trl") {
    const auto lengths = to_vector(in.at("completion_length"), "completion_length");
    std::vector<double> penalty(lengths.size());
    ulorl::soft_overlong_penalties(std::span<const double>(lengths), std::span<double>(penalty),
                                   {.max_length = param_double(params, "max_completion_len", 0),
                                    .cache_length = param_double(params, "soft_punish_cache", 0)});
    return json{{"penalty", penalty}};
  }
  throw reject("unknown overlong_penalty preset '" + preset + "'");
}

const registrar reg_advantage("advantage", advantage);
const registrar reg_overlong("overlong_penalty", overlong_penalty);

}  // namespace
