// python/src/module.cpp — the `ulorl._ulorl` extension: ulorl.Error, the loss configuration, the
// frameworks' presets (ulorl/presets/<framework>.hpp), the controllers
// (ulorl/control/), the segment scheduler and its provenance queries (ulorl/rollout/). No torch
// header here: the tensor functions are in losses.cpp, corrections.cpp and logits.cpp. Presets are the C++ presets called with the frameworks' option
// names; no formula is restated here.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <ulorl/advantage/fields.hpp>
#include <ulorl/advantage/group_advantage.hpp>
#include <ulorl/control/entropy_controller.hpp>
#include <ulorl/control/kl_controller.hpp>
#include <ulorl/control/reference_reset.hpp>
#include <ulorl/presets.hpp>
#include <ulorl/rollout/checkpoint.hpp>
#include <ulorl/rollout/provenance.hpp>
#include <ulorl/rollout/segment_scheduler.hpp>

#include "common.hpp"

namespace ulorl_py {

namespace {

using namespace pybind11::literals;
constexpr double inf = std::numeric_limits<double>::infinity();

PyObject* error_type = nullptr;

// ---- names of the enums: the library's tables (objective_names, kl_estimator_names, agg_mode_names,
// sequence_gradient_names, pg_surrogate_names), parsed by ulorl::value_of_name ------------------------
ulorl::objective_kind objective_of(std::string_view s) {
  return ulorl::value_of_name("policy_loss", "objective", s, ulorl::objective_names);
}
ulorl::sequence_gradient seq_gradient_of(std::string_view s) {
  return ulorl::value_of_name("policy_loss", "seq_gradient", s, ulorl::sequence_gradient_names);
}
ulorl::pg_surrogate surrogate_of(std::string_view s) {
  return ulorl::value_of_name("policy_loss", "surrogate", s, ulorl::pg_surrogate_names);
}
ulorl::kl_estimator kl_of(std::string_view s) {
  return ulorl::value_of_name("policy_loss", "kl_estimator", s, ulorl::kl_estimator_names);
}
ulorl::agg_mode agg_of(std::string_view s) { return ulorl::value_of_name("policy_loss", "agg_mode", s, ulorl::agg_mode_names); }
//! The name of an enum value (a value no name has, e.g. from a decoded configuration, prints as
//! "unknown", and the loss call rejects it).
template <class Table, class E>
std::string name_or_unknown(const Table& table, E value) {
  const std::string_view n = ulorl::name_in(table, value);
  return n.empty() ? std::string("unknown") : std::string(n);
}
std::string name_of(ulorl::objective_kind k) { return name_or_unknown(ulorl::objective_names, k); }
std::string name_of(ulorl::kl_estimator e) { return name_or_unknown(ulorl::kl_estimator_names, e); }
std::string name_of(ulorl::agg_mode a) { return name_or_unknown(ulorl::agg_mode_names, a); }
std::string name_of(ulorl::sequence_gradient g) { return name_or_unknown(ulorl::sequence_gradient_names, g); }
std::string name_of(ulorl::pg_surrogate g) { return name_or_unknown(ulorl::pg_surrogate_names, g); }

std::string repr_counts(const ulorl::batch_counts& c) {
  return "BatchCounts(tokens=" + py::repr(py::float_(c.tokens)).cast<std::string>() +
         ", sequences=" + py::repr(py::float_(c.sequences)).cast<std::string>() +
         ", rows=" + py::repr(py::float_(c.rows)).cast<std::string>() + ")";
}

// ---- loss configuration ---------------------------------------------------------------------------
void bind_config(py::module_& m) {
  py::class_<ulorl::batch_counts>(m, "BatchCounts",
                                  "Valid tokens, non-empty rows (sequences) and rows of (part of) a batch. Counts of "
                                  "disjoint parts add up (+): sum them over micro-batches and ranks (all-reduce) to get "
                                  "the step's global counts.")
      .def(py::init([](double tokens, double sequences, double rows) {
             return ulorl::batch_counts{tokens, sequences, rows};
           }),
           "tokens"_a = 0.0, "sequences"_a = 0.0, "rows"_a = 0.0)
      .def_readwrite("tokens", &ulorl::batch_counts::tokens)
      .def_readwrite("sequences", &ulorl::batch_counts::sequences)
      .def_readwrite("rows", &ulorl::batch_counts::rows)
      .def("__add__", [](const ulorl::batch_counts& a, const ulorl::batch_counts& b) { return a + b; })
      .def("__eq__", [](const ulorl::batch_counts& a, const ulorl::batch_counts& b) {
        return a.tokens == b.tokens && a.sequences == b.sequences && a.rows == b.rows;
      })
      .def("to_list", [](const ulorl::batch_counts& c) { return std::vector<double>{c.tokens, c.sequences, c.rows}; },
           "[tokens, sequences, rows] (e.g. for a torch.distributed all-reduce).")
      .def_static(
          "from_list",
          [](const std::vector<double>& v) {
            if (v.size() != 3) ulorl::detail::fail("BatchCounts.from_list", "values", "must hold 3 numbers");
            return ulorl::batch_counts{v[0], v[1], v[2]};
          },
          "values"_a)
      .def("__repr__", &repr_counts);

  py::class_<ulorl::agg_normalizer>(m, "Normalizer",
                                    "The step's aggregation normaliser: loss = scale * sum_b sum_t L m / D_b with D_b "
                                    "from `mode` and `denominator` (ulorl/loss/aggregation.hpp).")
      .def(py::init([](const std::string& mode, double denominator, double scale) {
             return ulorl::agg_normalizer{agg_of(mode), denominator, scale};
           }),
           "mode"_a, "denominator"_a, "scale"_a = 1.0)
      .def_property(
          "mode", [](const ulorl::agg_normalizer& n) { return name_of(n.mode); },
          [](ulorl::agg_normalizer& n, const std::string& s) { n.mode = agg_of(s); })
      .def_readwrite("denominator", &ulorl::agg_normalizer::denominator)
      .def_readwrite("scale", &ulorl::agg_normalizer::scale)
      .def("__repr__", [](const ulorl::agg_normalizer& n) {
        return std::string("Normalizer(mode='") + name_of(n.mode) + "', denominator=" +
               py::repr(py::float_(n.denominator)).cast<std::string>() +
               ", scale=" + py::repr(py::float_(n.scale)).cast<std::string>() + ")";
      });

  m.def(
      "global_normalizer",
      [](const std::string& mode, const ulorl::batch_counts& counts, double constant, double scale) {
        ulorl::require_not_nan("global_normalizer", "constant", constant);  // even where `mode` does not use it
        const auto n = ulorl::global_normalizer(agg_of(mode), counts, constant, scale);
        ulorl::validate_normalizer("global_normalizer", n);
        return n;
      },
      "mode"_a, "counts"_a, "constant"_a = 0.0, "scale"_a = 1.0,
      "The normaliser of a global batch: token_mean divides by counts.tokens, seq_mean_* by counts.sequences, "
      "seq_mean_token_sum_norm and constant by `constant`; `scale` is the reduction convention (1 when gradients "
      "are summed over ranks, the data-parallel size when DDP averages them).");

  using C = ulorl::policy_loss_config;
  py::class_<C>(m, "PolicyLossConfig",
                "Every parameter of the fused policy loss (ulorl::policy_loss_config), flattened: the objective, "
                "the KL term, the entropy term, the aggregation normaliser and check_values.")
      .def(py::init<>())
      .def("__copy__", [](const C& c) { return c; })
      .def_property(
          "objective", [](const C& c) { return name_of(c.objective.kind); },
          [](C& c, const std::string& s) { c.objective.kind = objective_of(s); })
      .def_property(
          "eps_low", [](const C& c) { return c.objective.eps_low; }, [](C& c, double v) { c.objective.eps_low = v; })
      .def_property(
          "eps_high", [](const C& c) { return c.objective.eps_high; }, [](C& c, double v) { c.objective.eps_high = v; })
      .def_property(
          "dual_clip", [](const C& c) { return c.objective.dual_clip; }, [](C& c, double v) { c.objective.dual_clip = v; })
      .def_property(
          "delta", [](const C& c) { return c.objective.delta; }, [](C& c, double v) { c.objective.delta = v; })
      .def_property(
          "log_ratio_clamp", [](const C& c) { return c.objective.log_ratio_clamp; },
          [](C& c, double v) { c.objective.log_ratio_clamp = v; })
      .def_property(
          "seq_log_ratio_max", [](const C& c) { return c.objective.gspo.seq_log_ratio_max; },
          [](C& c, double v) { c.objective.gspo.seq_log_ratio_max = v; })
      .def_property(
          "seq_gradient", [](const C& c) { return name_of(c.objective.gspo.seq_gradient); },
          [](C& c, const std::string& s) { c.objective.gspo.seq_gradient = seq_gradient_of(s); })
      .def_property(
          "surrogate", [](const C& c) { return name_of(c.objective.penalized_pg.surrogate); },
          [](C& c, const std::string& s) { c.objective.penalized_pg.surrogate = surrogate_of(s); },
          "penalized_pg: g = the ratio ('ratio') or the log-prob ('log_prob').")
      .def_property(
          "square_penalty", [](const C& c) { return c.objective.penalized_pg.square_penalty; },
          [](C& c, double v) { c.objective.penalized_pg.square_penalty = v; }, "penalized_pg: c_sq of c_sq x^2 / 2 (>= 0).")
      .def_property(
          "abs_penalty", [](const C& c) { return c.objective.penalized_pg.abs_penalty; },
          [](C& c, double v) { c.objective.penalized_pg.abs_penalty = v; })
      .def_property(
          "tau_pos", [](const C& c) { return c.objective.sapo.tau_pos; }, [](C& c, double v) { c.objective.sapo.tau_pos = v; })
      .def_property(
          "tau_neg", [](const C& c) { return c.objective.sapo.tau_neg; }, [](C& c, double v) { c.objective.sapo.tau_neg = v; })
      .def_property(
          "kl_estimator", [](const C& c) { return name_of(c.kl.estimator); },
          [](C& c, const std::string& s) { c.kl.estimator = kl_of(s); })
      .def_property(
          "kl_straight_through", [](const C& c) { return c.kl.straight_through; },
          [](C& c, bool v) { c.kl.straight_through = v; })
      .def_property(
          "kl_input_clamp", [](const C& c) { return c.kl.input_clamp; }, [](C& c, double v) { c.kl.input_clamp = v; })
      .def_property(
          "kl_output_clamp", [](const C& c) { return c.kl.output_clamp; }, [](C& c, double v) { c.kl.output_clamp = v; })
      .def_property(
          "kl_importance_weighted", [](const C& c) { return c.kl.importance_weighted; },
          [](C& c, bool v) { c.kl.importance_weighted = v; })
      .def_readwrite("kl_coef", &C::kl_coef)
      .def_readwrite("entropy_coef", &C::entropy_coef)
      .def_readwrite("normalizer", &C::normalizer)
      .def_readwrite("check_values", &C::check_values)
      .def_readwrite("rollout", &C::rollout,
                     "A RolloutCorrectionConfig computed inside the loss pass (needs rollout_log_prob), or None.")
      .def_readwrite("rollout_batch_norm_factor", &C::rollout_batch_norm_factor,
                     "The weights' divisor with rollout.batch_normalize (rollout_correction_finalize's "
                     "batch_norm_factor of the whole batch), else None.")
      .def("__repr__", [](const C& c) {
        std::string s = std::string("PolicyLossConfig(objective='") + name_of(c.objective.kind) + "'";
        const auto f = [&](const char* k, double v) { s += std::string(", ") + k + "=" + py::repr(py::float_(v)).cast<std::string>(); };
        f("eps_low", c.objective.eps_low), f("eps_high", c.objective.eps_high), f("dual_clip", c.objective.dual_clip);
        f("delta", c.objective.delta), f("log_ratio_clamp", c.objective.log_ratio_clamp);
        f("seq_log_ratio_max", c.objective.gspo.seq_log_ratio_max);
        s += std::string(", kl_estimator='") + name_of(c.kl.estimator) + "'";
        f("kl_input_clamp", c.kl.input_clamp), f("kl_output_clamp", c.kl.output_clamp), f("kl_coef", c.kl_coef);
        f("entropy_coef", c.entropy_coef);
        s += std::string(", agg_mode='") + name_of(c.normalizer.mode) + "'";
        f("denominator", c.normalizer.denominator), f("scale", c.normalizer.scale);
        return s + ")";
      });

  py::class_<ulorl::policy_loss_result>(m, "PolicyLossResult", "The loss parts and metrics of one policy-loss call.")
      .def_readonly("loss", &ulorl::policy_loss_result::loss)
      .def_readonly("pg_loss", &ulorl::policy_loss_result::pg_loss)
      .def_readonly("kl_loss", &ulorl::policy_loss_result::kl_loss)
      .def_readonly("entropy_loss", &ulorl::policy_loss_result::entropy_loss)
      .def_readonly("rollout", &ulorl::policy_loss_result::rollout,
                    "With config.rollout: the rollout correction's RolloutCorrectionStatistics of this call.")
      .def("as_dict", &result_dict);
}

// ---- presets -----------------------------------------------------------------------------------------
ulorl::policy_loss_config with_kl(ulorl::policy_loss_config c, const ulorl::kl_config& kl, double coef) {
  c.kl = kl;
  c.kl_coef = coef;
  return c;
}

void bind_presets(py::module_& m) {
  namespace P = ulorl::presets;
  using opt = std::optional<double>;
  m.def(
      "_verl_config",
      [](const std::string& loss_mode, double low, double high, double c, double tau_pos, double tau_neg,
         const std::string& loss_agg_mode, const ulorl::batch_counts& counts, double dp_size, opt batch_num_tokens,
         opt global_batch_size, opt loss_scale_factor, std::size_t padded_length, std::optional<std::string> kl_penalty,
         double kl_coef, double entropy_coeff, opt dro_beta, double kl_cov_ratio, double ppo_kl_coef,
         double clip_cov_ratio, double clip_cov_lb, double clip_cov_ub) {
        ulorl::policy_loss_config cfg;
        const auto mode = P::verl::loss_mode_from_name(loss_mode);
        cfg.objective = P::verl::objective({.loss_mode = mode, .clip_ratio_low = low, .clip_ratio_high = high,
                                            .clip_ratio_c = c, .tau_pos = tau_pos, .tau_neg = tau_neg,
                                            .dro_beta = dro_beta, .kl_cov_ratio = kl_cov_ratio,
                                            .ppo_kl_coef = ppo_kl_coef, .clip_cov_ratio = clip_cov_ratio,
                                            .clip_cov_lb = clip_cov_lb, .clip_cov_ub = clip_cov_ub});
        cfg.normalizer = P::verl::policy_normalizer(
            mode, verl_normalizer_options(loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor, padded_length),
            counts);
        if (kl_penalty) cfg = with_kl(cfg, P::verl::kl(P::verl::kl_penalty_from_name(*kl_penalty)), kl_coef);
        cfg.entropy_coef = entropy_coeff;
        return cfg;
      },
      "loss_mode"_a, "clip_ratio_low"_a, "clip_ratio_high"_a, "clip_ratio_c"_a, "tau_pos"_a, "tau_neg"_a,
      "loss_agg_mode"_a, "counts"_a, "dp_size"_a, "batch_num_tokens"_a, "global_batch_size"_a, "loss_scale_factor"_a,
      "padded_length"_a, "kl_penalty"_a, "kl_coef"_a, "entropy_coeff"_a, "dro_beta"_a = py::none(),
      "kl_cov_ratio"_a = P::verl::objective_options{}.kl_cov_ratio, "ppo_kl_coef"_a = P::verl::objective_options{}.ppo_kl_coef,
      "clip_cov_ratio"_a = P::verl::objective_options{}.clip_cov_ratio, "clip_cov_lb"_a = P::verl::objective_options{}.clip_cov_lb,
      "clip_cov_ub"_a = P::verl::objective_options{}.clip_cov_ub);
  m.def(
      "_verl_metrics",
      [](const std::string& loss_mode, const ulorl::policy_loss_result& r, double pg_clipfrac, double pg_clipfrac_lower,
         double ppo_kl) {
        const auto x = P::verl::metrics(P::verl::loss_mode_from_name(loss_mode), r.metrics,
                                        {.dropped_fraction = pg_clipfrac, .capped_fraction = pg_clipfrac_lower,
                                         .mean_abs_log_ratio = ppo_kl});
        return py::dict("pg_clipfrac"_a = x.pg_clipfrac, "ppo_kl"_a = x.ppo_kl, "pg_clipfrac_lower"_a = x.pg_clipfrac_lower);
      },
      "loss_mode"_a, "result"_a, "pg_clipfrac"_a = 0.0, "pg_clipfrac_lower"_a = 0.0, "ppo_kl"_a = 0.0,
      "verl's pg_clipfrac, ppo_kl, pg_clipfrac_lower of a loss mode; dppo_*, kl_cov and clip_cov take the statistics "
      "their batch pass returned.");
  m.def(
      "_openrlhf_config",
      [](const std::string& policy_loss_type, double low, double high, opt dual_clip, bool token_level_loss,
         const ulorl::batch_counts& counts, double dp_size, opt batch_num_tokens, opt global_batch_size,
         std::optional<std::string> kl_estimator, double kl_coef) {
        ulorl::policy_loss_config cfg;
        const auto type = P::openrlhf::policy_loss_type_from_name(policy_loss_type);
        cfg.objective = P::openrlhf::objective(
            {.policy_loss_type = type, .clip_eps_low = low, .clip_eps_high = high, .dual_clip = dual_clip});
        cfg.normalizer = P::openrlhf::policy_normalizer(type,
                                                        {.token_level_loss = token_level_loss,
                                                         .dp_size = dp_size,
                                                         .batch_num_tokens = batch_num_tokens,
                                                         .global_batch_size = global_batch_size},
                                                        counts);
        if (kl_estimator)
          cfg = with_kl(cfg, P::openrlhf::kl({.kl_estimator = P::openrlhf::kl_estimator_from_name(*kl_estimator)}), kl_coef);
        return cfg;
      },
      "policy_loss_type"_a, "clip_eps_low"_a, "clip_eps_high"_a, "dual_clip"_a, "token_level_loss"_a, "counts"_a,
      "dp_size"_a, "batch_num_tokens"_a, "global_batch_size"_a, "kl_estimator"_a, "kl_coef"_a);

  // Advantage presets (ulorl/presets/<framework>.hpp) as an opaque value for group_advantages.
  py::class_<ulorl::advantage_preset>(m, "AdvantagePreset",
                                      "How per-response advantages are computed (group statistics) and how they reach "
                                      "the tokens (placement): one framework's choice (ulorl/presets/<framework>.hpp).")
      .def_property_readonly(
          "group_config", [](const ulorl::advantage_preset& p) { return ulorl::encode_fields(p.group); },
          "The group statistics as the `float[] config` of torch.ops.ulorl.group_advantages.")
      .def_property_readonly(
          "broadcast_config", [](const ulorl::advantage_preset& p) { return ulorl::encode_fields(p.broadcast); },
          "The placement as the `float[] config` of torch.ops.ulorl.broadcast_to_tokens.");
  m.def(
      "_advantage_preset",
      [](const std::string& preset, const std::string& estimator, double epsilon, bool norm_adv_by_std,
         const std::string& scale_rewards, bool leave_one_out, bool normalize) {
        constexpr std::string_view fn = "group_advantages";
        if (preset == "verl") {
          if (estimator == "grpo") return P::verl::grpo_advantage({.epsilon = epsilon, .norm_adv_by_std_in_grpo = norm_adv_by_std});
          if (estimator == "rloo") return P::verl::rloo_advantage();
          ulorl::detail::fail(fn, "estimator", "unknown verl estimator '" + estimator + "' (expected 'grpo' or 'rloo')");
        }
        if (preset == "trl") return P::trl::advantage(trl_scale_rewards_of(fn, scale_rewards));
        if (preset == "openrlhf") {
          using E = P::openrlhf::advantage_estimator;
          return P::openrlhf::advantage(parse_name<E>(
              fn, "estimator", estimator, {{"group_norm", E::group_norm}, {"rloo", E::rloo}, {"dr_grpo", E::dr_grpo}}));
        }
        if (preset == "nemo_rl")
          return P::nemo_rl::advantage({.use_leave_one_out_baseline = leave_one_out, .normalize_rewards = normalize});
        if (preset == "open_instruct") {
          using N = P::open_instruct::advantage_normalization;
          if (estimator == "standard") return P::open_instruct::advantage({.advantage_normalization_type = N::standard});
          if (estimator == "centered") return P::open_instruct::advantage({.advantage_normalization_type = N::centered});
          ulorl::detail::fail(fn, "estimator",
                              "unknown open_instruct estimator '" + estimator + "' (expected 'standard' or 'centered')");
        }
        ulorl::detail::fail(fn, "preset",
                            "unknown preset '" + preset +
                                "' (expected 'verl', 'trl', 'openrlhf', 'nemo_rl', 'open_instruct' or 'custom')");
      },
      "preset"_a, "estimator"_a, "epsilon"_a, "norm_adv_by_std"_a, "scale_rewards"_a, "leave_one_out"_a, "normalize"_a);
  m.def(
      "_custom_advantage",
      [](const std::string& baseline, const std::string& scale, const std::string& std_, double eps,
         const std::string& eps_at, const std::string& singleton, const std::string& zero_std,
         const std::string& placement, bool allow_empty_rows) {
        constexpr std::string_view fn = "group_advantages";
        ulorl::advantage_preset p;
        using B = ulorl::baseline_kind;
        using S = ulorl::scale_kind;
        using D = ulorl::std_estimator;
        using E = ulorl::eps_placement;
        using R = ulorl::singleton_rule;
        using Z = ulorl::zero_std_rule;
        using T = ulorl::token_placement;
        p.group.baseline = parse_name<B>(fn, "baseline", baseline,
                                         {{"group_mean", B::group_mean}, {"leave_one_out", B::leave_one_out}, {"none", B::none}});
        p.group.scale = parse_name<S>(fn, "scale", scale,
                                      {{"none", S::none}, {"group_std", S::group_std},
                                       {"leave_one_out_std", S::leave_one_out_std}, {"batch_std", S::batch_std}});
        p.group.std = parse_name<D>(fn, "std", std_, {{"unbiased", D::unbiased}, {"biased", D::biased}});
        p.group.eps = eps;
        p.group.eps_at = parse_name<E>(fn, "eps_at", eps_at, {{"add_to_std", E::add_to_std}, {"add_to_variance", E::add_to_variance}});
        p.group.singleton = parse_name<R>(fn, "singleton", singleton,
                                          {{"zero", R::zero}, {"identity", R::identity}, {"reject", R::reject}});
        p.group.zero_std = parse_name<Z>(fn, "zero_std", zero_std, {{"divide", Z::divide}, {"skip", Z::skip}});
        p.broadcast.placement = parse_name<T>(fn, "placement", placement,
                                              {{"masked", T::masked}, {"through_last", T::through_last},
                                               {"every_position", T::every_position}});
        p.broadcast.allow_empty_rows = allow_empty_rows;
        return p;
      },
      "baseline"_a, "scale"_a, "std"_a, "eps"_a, "eps_at"_a, "singleton"_a, "zero_std"_a, "placement"_a,
      "allow_empty_rows"_a);
}

// ---- controllers ------------------------------------------------------------------------------------------
std::span<const std::byte> byte_span(const py::bytes& b) {
  char* p = nullptr;
  py::ssize_t n = 0;
  if (PyBytes_AsStringAndSize(b.ptr(), &p, &n) != 0) throw py::error_already_set();
  return {reinterpret_cast<const std::byte*>(p), static_cast<std::size_t>(n)};
}
py::bytes to_bytes(const std::vector<std::byte>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

void bind_controllers(py::module_& m) {
  using K = ulorl::kl_controller;
  py::class_<K>(m, "KLController",
                "The KL coefficient beta: fixed, or Ziegler et al.'s adaptive proportional controller as verl and "
                "OpenRLHF implement it (ulorl/control/kl_controller.hpp).")
      .def(py::init([](const std::string& type, double init_coef, double target_kl, double horizon, double max_error,
                       double min_coef, double max_coef) {
             ulorl::kl_controller_config c;
             c.type = parse_name<ulorl::kl_control_type>("kl_controller", "type", type,
                                                         {{"fixed", ulorl::kl_control_type::fixed},
                                                          {"adaptive", ulorl::kl_control_type::adaptive}});
             c.init_coef = init_coef, c.target_kl = target_kl, c.horizon = horizon, c.max_error = max_error;
             c.min_coef = min_coef, c.max_coef = max_coef;
             return K(c);
           }),
           py::kw_only(), "type"_a = "fixed", "init_coef"_a = 0.001, "target_kl"_a = 0.1, "horizon"_a = 10000.0,
           "max_error"_a = 0.2, "min_coef"_a = 0.0, "max_coef"_a = ulorl::kl_coef_limit)
      .def("update", &K::update, "current_kl"_a, "n_steps"_a, "Folds one batch's mean KL in; returns the new beta.")
      .def_property_readonly("value", &K::value)
      .def_property_readonly("updates", [](const K& k) { return k.state().updates; })
      .def_property_readonly("last_kl", [](const K& k) { return k.state().last_kl; })
      .def_property_readonly("last_error", [](const K& k) { return k.state().last_error; })
      .def("save", [](const K& k) { return to_bytes(k.save()); }, "Configuration and state as checkpoint bytes.")
      .def_static("restore", [](const py::bytes& b) { return K::restore(byte_span(b)); }, "data"_a,
                  "A controller rebuilt from save()'s bytes (every field re-checked).");

  using E = ulorl::entropy_controller;
  py::class_<E>(m, "EntropyController",
                "An adaptive entropy-bonus coefficient steering the mean token entropy to a target "
                "(ulorl/control/entropy_controller.hpp; Skywork-OR1's step rule by default).")
      .def(py::init([](const std::string& rule, double target_entropy, double init_coef, double step_up,
                       double step_down, double gain, double tolerance, double min_coef, double max_coef,
                       bool gate_above_target) {
             ulorl::entropy_controller_config c;
             c.rule = parse_name<ulorl::entropy_control_rule>(
                 "entropy_controller", "rule", rule,
                 {{"step", ulorl::entropy_control_rule::step}, {"proportional", ulorl::entropy_control_rule::proportional}});
             c.target_entropy = target_entropy, c.init_coef = init_coef, c.step_up = step_up, c.step_down = step_down;
             c.gain = gain, c.tolerance = tolerance, c.min_coef = min_coef, c.max_coef = max_coef;
             c.gate_above_target = gate_above_target;
             return E(c);
           }),
           py::kw_only(), "rule"_a = "step", "target_entropy"_a = 0.2, "init_coef"_a = 0.0, "step_up"_a = 0.005,
           "step_down"_a = 0.005, "gain"_a = 0.05, "tolerance"_a = 0.0, "min_coef"_a = 0.0, "max_coef"_a = 0.1,
           "gate_above_target"_a = true)
      .def("bonus", py::overload_cast<double>(&E::bonus, py::const_), "entropy"_a, "The coefficient to apply to a batch of mean entropy H (before its update).")
      .def("bonus", py::overload_cast<>(&E::bonus, py::const_),
           "The coefficient to apply to the next step when the gate reads the last update's entropy (TRL's "
           "use_adaptive_entropy, presets.trl.adaptive_entropy_controller).")
      .def("update", &E::update, "entropy"_a, "Folds one mean entropy in; returns the new (ungated) coefficient.")
      .def_property_readonly("value", &E::value)
      .def_property_readonly("updates", [](const E& e) { return e.state().updates; })
      .def_property_readonly("last_entropy", [](const E& e) { return e.state().last_entropy; })
      .def("save", [](const E& e) { return to_bytes(e.save()); })
      .def_static("restore", [](const py::bytes& b) { return E::restore(byte_span(b)); }, "data"_a);

  using A = ulorl::presets::trl::adaptive_entropy_params;
  py::class_<A>(m, "TRLAdaptiveEntropyParams",
                "TRL GRPOConfig's adaptive entropy fields (presets::trl::adaptive_entropy_params); a default-made one "
                "holds GRPOConfig's defaults.")
      .def(py::init<>())
      .def_readwrite("entropy_coef", &A::entropy_coef)
      .def_readwrite("entropy_target", &A::entropy_target)
      .def_readwrite("entropy_coef_delta", &A::entropy_coef_delta)
      .def_readwrite("entropy_coef_min", &A::entropy_coef_min)
      .def_readwrite("entropy_coef_max", &A::entropy_coef_max);
  m.def(
      "_trl_adaptive_entropy", [](const A& p) { return E(ulorl::presets::trl::adaptive_entropy(p)); }, "params"_a);

  using R = ulorl::reference_reset_policy;
  const auto action = [](const ulorl::reset_action& a) {
    return py::dict("reset_reference"_a = a.reset_reference, "reset_optimizer"_a = a.reset_optimizer,
                    "trigger"_a = std::string(ulorl::to_string(a.trigger)),
                    "suppressed_by_cooldown"_a = a.suppressed_by_cooldown, "step"_a = a.event.step,
                    "value"_a = a.event.value, "index"_a = a.event.index);
  };
  py::class_<R>(m, "ReferenceResetPolicy",
                "When to reset the KL reference policy (and the optimizer) to the current policy, ProRL's hard "
                "reset (ulorl/control/reference_reset.hpp). Each call returns the action as a dict.")
      .def(py::init([](std::int64_t every_n_steps, bool on_plateau, std::int64_t patience, double min_delta,
                       bool higher_is_better, bool on_drop, double max_drop, bool on_kl_share, double max_kl_share,
                       std::int64_t kl_share_patience, std::int64_t cooldown_steps, bool manual_ignores_cooldown,
                       bool reset_optimizer) {
             return R({.every_n_steps = every_n_steps, .on_plateau = on_plateau, .patience = patience,
                       .min_delta = min_delta, .higher_is_better = higher_is_better, .on_drop = on_drop,
                       .max_drop = max_drop, .on_kl_share = on_kl_share, .max_kl_share = max_kl_share,
                       .kl_share_patience = kl_share_patience, .cooldown_steps = cooldown_steps,
                       .manual_ignores_cooldown = manual_ignores_cooldown, .reset_optimizer = reset_optimizer});
           }),
           py::kw_only(), "every_n_steps"_a = 0, "on_plateau"_a = true, "patience"_a = 5, "min_delta"_a = 0.0,
           "higher_is_better"_a = true, "on_drop"_a = false, "max_drop"_a = 0.05, "on_kl_share"_a = false,
           "max_kl_share"_a = 0.5, "kl_share_patience"_a = 1, "cooldown_steps"_a = 0,
           "manual_ignores_cooldown"_a = false, "reset_optimizer"_a = true)
      .def("observe_step", [action](R& r, std::int64_t step, double kl_term, double policy_term) {
             return action(r.observe_step(step, kl_term, policy_term));
           }, "step"_a, "kl_term"_a, "policy_term"_a)
      .def("observe_validation", [action](R& r, std::int64_t step, double metric) {
             return action(r.observe_validation(step, metric));
           }, "step"_a, "metric"_a)
      .def("request_manual", [action](R& r, std::int64_t step) { return action(r.request_manual(step)); }, "step"_a)
      .def_property_readonly("cooldown_remaining", &R::cooldown_remaining)
      .def_property_readonly("resets", [](const R& r) { return r.state().resets; })
      .def_property_readonly("best", [](const R& r) -> py::object {
        return r.state().has_best ? py::object(py::float_(r.state().best)) : py::none();
      })
      .def("save", [](const R& r) { return to_bytes(r.save()); })
      .def_static("restore", [](const py::bytes& b) { return R::restore(byte_span(b)); }, "data"_a);
  m.def("kl_share", &ulorl::kl_share, "kl_term"_a, "policy_term"_a,
        "|kl| / (|kl| + |policy|): the KL term's share of the loss (0 when both are 0).");
}

// ---- segment scheduler -----------------------------------------------------------------------------------
const char* name_of(ulorl::response_state s) { return ulorl::detail::to_string(s); }

py::list spans_list(std::span<const ulorl::version_span> spans) {
  py::list l;
  for (const auto& s : spans) l.append(py::make_tuple(s.begin, s.end, s.version));
  return l;
}
std::vector<ulorl::version_span> spans_from(const std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>& v) {
  std::vector<ulorl::version_span> out;
  out.reserve(v.size());
  for (const auto& [b, e, ver] : v) out.push_back({b, e, ver});
  return out;
}
ulorl::old_log_prob_config is_config(const std::string& mode, std::int64_t current_version, std::int64_t max_staleness,
                                    bool trust) {
  ulorl::old_log_prob_config c;
  c.mode = parse_name<ulorl::is_mode>("old_log_prob_plan", "mode", mode,
                                      {{"tois", ulorl::is_mode::tois}, {"sais", ulorl::is_mode::sais}, {"pois", ulorl::is_mode::pois}});
  c.current_version = current_version, c.max_staleness = max_staleness, c.trust_rollout_log_probs = trust;
  return c;
}

//! The scheduler with checkpoint bytes in and out; restore() replaces the whole state only when the
//! bytes check out.
struct scheduler_box {
  ulorl::segment_scheduler s;
};

py::dict counters_dict(const ulorl::scheduler_counters& k) {
  return py::dict("offered_groups"_a = k.offered_groups, "admitted_groups"_a = k.admitted_groups,
                  "released_groups"_a = k.released_groups, "released_responses"_a = k.released_responses,
                  "finished_responses"_a = k.finished_responses, "truncated_responses"_a = k.truncated_responses,
                  "planned_items"_a = k.planned_items, "reported_items"_a = k.reported_items,
                  "failed_items"_a = k.failed_items, "aborted_items"_a = k.aborted_items, "stale_drops"_a = k.stale_drops,
                  "generated_tokens"_a = k.generated_tokens, "released_tokens"_a = k.released_tokens,
                  "dropped_tokens"_a = k.dropped_tokens);
}

void bind_scheduler(py::module_& m) {
  py::class_<ulorl::plan_item>(m, "PlanItem", "Decode up to max_new_tokens for one response, from start_token on.")
      .def_readonly("response_id", &ulorl::plan_item::response_id)
      .def_readonly("group_id", &ulorl::plan_item::group_id)
      .def_readonly("index_in_group", &ulorl::plan_item::index_in_group)
      .def_readonly("start_token", &ulorl::plan_item::start_token)
      .def_readonly("max_new_tokens", &ulorl::plan_item::max_new_tokens)
      .def_readonly("policy_version", &ulorl::plan_item::policy_version)
      .def("__eq__", [](const ulorl::plan_item& a, const ulorl::plan_item& b) { return a == b; })
      .def("__repr__", [](const ulorl::plan_item& p) {
        return "PlanItem(response_id=" + std::to_string(p.response_id) + ", start_token=" + std::to_string(p.start_token) +
               ", max_new_tokens=" + std::to_string(p.max_new_tokens) + ", policy_version=" + std::to_string(p.policy_version) + ")";
      });

  using S = scheduler_box;
  py::class_<S>(m, "SegmentScheduler",
                "UloRL's segment rollout as a host-driven state machine (ulorl/rollout/segment_scheduler.hpp): "
                "plan() -> the engine decodes the items -> report(...) per item -> end_step(); update_policy(v) and "
                "take_experience() at any time. Every rejected call raises ulorl.Error and changes nothing.")
      .def(py::init([](std::int32_t group_size, std::int64_t max_response_tokens, std::int32_t num_segments,
                       std::int64_t max_active_responses, std::int64_t max_decode_tokens,
                       std::int64_t max_new_groups_per_step, const std::string& order, std::int64_t release_batch_groups,
                       std::int64_t max_staleness, const std::string& on_stale) {
             constexpr std::string_view fn = "segment_scheduler";
             ulorl::segment_scheduler_config c;
             c.group_size = group_size, c.max_response_tokens = max_response_tokens, c.num_segments = num_segments;
             c.max_active_responses = max_active_responses, c.max_decode_tokens = max_decode_tokens;
             c.max_new_groups_per_step = max_new_groups_per_step;
             c.order = parse_name<ulorl::release_order>(fn, "config.order", order,
                                                        {{"completion", ulorl::release_order::completion},
                                                         {"admission", ulorl::release_order::admission}});
             c.release_batch_groups = release_batch_groups, c.max_staleness = max_staleness;
             c.on_stale = parse_name<ulorl::staleness_action>(fn, "config.on_stale", on_stale,
                                                              {{"recompute", ulorl::staleness_action::recompute},
                                                               {"drop", ulorl::staleness_action::drop}});
             return S{ulorl::segment_scheduler(c)};
           }),
           py::kw_only(), "group_size"_a = 8, "max_response_tokens"_a = 65536, "num_segments"_a = 4,
           "max_active_responses"_a = 1024, "max_decode_tokens"_a = 0, "max_new_groups_per_step"_a = 0,
           "order"_a = "completion", "release_batch_groups"_a = 0, "max_staleness"_a = -1, "on_stale"_a = "recompute")
      .def("offer_prompts", [](S& s, std::int64_t n) { return s.s.offer_prompts(n); }, "n"_a,
           "Queues n prompts (groups); returns the group id of the first.")
      .def("plan",
           [](S& s) {
             const auto p = s.s.plan();
             py::list items;
             for (const auto& it : p.items) items.append(it);
             return py::dict("step"_a = p.step, "policy_version"_a = p.policy_version, "items"_a = items,
                             "first_new_group"_a = p.first_new_group, "new_groups"_a = p.new_groups,
                             "planned_tokens"_a = p.planned_tokens, "resumed_items"_a = p.resumed_items);
           },
           "Opens a step; returns {'step', 'policy_version', 'items': [PlanItem], 'first_new_group', 'new_groups', "
           "'planned_tokens', 'resumed_items'}.")
      .def("current_plan", [](const S& s) {
        py::list items;
        for (const auto& it : s.s.current_plan()) items.append(it);
        return items;
      })
      .def("report",
           [](S& s, std::int64_t response_id, std::int64_t new_tokens, const std::string& outcome) {
             s.s.report(response_id, new_tokens,
                        parse_name<ulorl::decode_outcome>("segment_scheduler::report", "outcome", outcome,
                                                          {{"segment_end", ulorl::decode_outcome::segment_end},
                                                           {"eos", ulorl::decode_outcome::eos},
                                                           {"failed", ulorl::decode_outcome::failed}}));
           },
           "response_id"_a, "new_tokens"_a, "outcome"_a,
           "Reports one plan item: outcome 'segment_end' (exactly the planned tokens), 'eos' or 'failed'.")
      .def("abort", [](S& s, std::int64_t id) { s.s.abort(id); }, "response_id"_a)
      .def("end_step",
           [](S& s) {
             const auto x = s.s.end_step();
             return py::dict("step"_a = x.step, "items"_a = x.items, "reported"_a = x.reported, "failed"_a = x.failed,
                             "aborted"_a = x.aborted, "finished"_a = x.finished, "truncated"_a = x.truncated,
                             "new_tokens"_a = x.new_tokens, "completed_groups"_a = x.completed_groups);
           })
      .def("update_policy", [](S& s, std::int64_t v) { s.s.update_policy(v); }, "version"_a)
      .def("set_num_segments", [](S& s, std::int32_t n) { s.s.set_num_segments(n); }, "n"_a,
           "Changes the segment count for the plans that follow (between steps only).")
      .def("take_experience",
           [](S& s, bool allow_partial) {
             const auto& b = s.s.take_experience(allow_partial);
             py::list rs;
             for (const auto& r : b.responses) {
               const auto st = b.staleness(r);
               rs.append(py::dict("response_id"_a = r.response_id, "group_id"_a = r.group_id,
                                  "index_in_group"_a = r.index_in_group, "final_state"_a = name_of(r.final_state),
                                  "tokens"_a = r.tokens, "first_version"_a = r.first_version,
                                  "last_version"_a = r.last_version, "admitted_step"_a = r.admitted_step,
                                  "finish_step"_a = r.finish_step, "failures"_a = r.failures,
                                  "decode_steps"_a = r.decode_steps, "spans"_a = spans_list(b.spans_of(r)),
                                  "versions_spanned"_a = st.versions_spanned, "max_lag"_a = st.max_lag));
             }
             return py::dict("policy_version"_a = b.policy_version, "step"_a = b.step, "group_ids"_a = b.group_ids,
                             "responses"_a = rs);
           },
           "allow_partial"_a = false,
           "Releases whole completed groups: {'policy_version', 'step', 'group_ids', 'responses': [dict with "
           "'spans' = [(begin, end, version)], ...]}.")
      .def("state_of", [](const S& s, std::int64_t id) { return name_of(s.s.state_of(id)); }, "response_id"_a)
      .def("spans_of", [](const S& s, std::int64_t id) { return spans_list(s.s.spans_of(id)); }, "response_id"_a,
           "Provenance of a live response: [(begin, end, policy_version)].")
      .def("tokens_of", [](const S& s, std::int64_t id) { return s.s.tokens_of(id); }, "response_id"_a)
      .def_property_readonly("step", [](const S& s) { return s.s.step(); })
      .def_property_readonly("policy_version", [](const S& s) { return s.s.policy_version(); })
      .def_property_readonly("phase", [](const S& s) {
        return s.s.phase() == ulorl::scheduler_phase::idle ? "idle" : "planned";
      })
      .def_property_readonly("active_responses", [](const S& s) { return s.s.active_responses(); })
      .def_property_readonly("queued_groups", [](const S& s) { return s.s.queued_groups(); })
      .def_property_readonly("live_groups", [](const S& s) { return s.s.live_groups(); })
      .def_property_readonly("ready_groups", [](const S& s) { return s.s.ready_groups(); })
      .def_property_readonly("live_tokens", [](const S& s) { return s.s.live_tokens(); })
      .def_property_readonly("segment_tokens", [](const S& s) { return s.s.config().segment_tokens(); })
      .def_property_readonly("counters", [](const S& s) { return counters_dict(s.s.counters()); })
      .def("save", [](const S& s) { return to_bytes(ulorl::save_scheduler(s.s)); },
           "The whole state as checkpoint bytes (restore() them into any scheduler).")
      .def("restore", [](S& s, const py::bytes& b) { s.s = ulorl::restore_scheduler(byte_span(b)); }, "data"_a,
           "Replaces the whole state by save()'s bytes; corrupted bytes raise ulorl.Error and change nothing.")
      .def_static("from_bytes", [](const py::bytes& b) { return S{ulorl::restore_scheduler(byte_span(b))}; }, "data"_a)
      .def("to_json", [](const S& s) { return ulorl::scheduler_to_json(s.s); },
           "The state as JSON text (for inspection; not a restore format).");

  using span_list = std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>;
  m.def(
      "old_log_prob_plan",
      [](const span_list& spans, std::int64_t current_version, const std::string& mode, std::int64_t max_staleness,
         bool trust_rollout_log_probs) {
        const auto v = spans_from(spans);
        std::vector<ulorl::old_log_prob_span> out(v.size());
        const auto n = ulorl::old_log_prob_plan(v, out, is_config(mode, current_version, max_staleness, trust_rollout_log_probs));
        py::list l;
        for (std::size_t i = 0; i < n; ++i) l.append(py::make_tuple(out[i].begin, out[i].end, out[i].old_version, out[i].recompute));
        return l;
      },
      "spans"_a, py::kw_only(), "current_version"_a, "mode"_a = "pois", "max_staleness"_a = -1,
      "trust_rollout_log_probs"_a = true,
      "Which policy version's log-prob is each token's old log-prob (TOIS / SAIS / POIS): "
      "[(begin, end, old_version, recompute)] runs.");
  m.def(
      "recompute_token_count",
      [](const span_list& spans, std::int64_t current_version, const std::string& mode, std::int64_t max_staleness,
         bool trust_rollout_log_probs) {
        return ulorl::recompute_token_count(spans_from(spans),
                                            is_config(mode, current_version, max_staleness, trust_rollout_log_probs));
      },
      "spans"_a, py::kw_only(), "current_version"_a, "mode"_a = "pois", "max_staleness"_a = -1,
      "trust_rollout_log_probs"_a = true);
  m.def(
      "old_log_prob_versions",
      [](const span_list& spans, std::int64_t current_version, const std::string& mode, std::int64_t max_staleness,
         bool trust_rollout_log_probs) {
        constexpr std::string_view fn = "fill_old_log_prob_versions";
        const auto v = spans_from(spans);
        const auto cfg = is_config(mode, current_version, max_staleness, trust_rollout_log_probs);
        ulorl::validate_old_log_prob_inputs(fn, v, cfg);  // before the result of span_tokens(v) entries exists
        const std::int64_t tokens = ulorl::span_tokens(v);
        std::vector<std::int64_t> out;
        try {
          out.resize(static_cast<std::size_t>(tokens));
        } catch (const std::exception&) {  // std::bad_alloc, std::length_error
          ulorl::detail::fail_at(fn, "spans.end", static_cast<std::int64_t>(v.size()) - 1, tokens,
                                 "the response's token count is too large for the per-token list");
        }
        ulorl::fill_old_log_prob_versions(v, out, cfg);
        return out;
      },
      "spans"_a, py::kw_only(), "current_version"_a, "mode"_a = "pois", "max_staleness"_a = -1,
      "trust_rollout_log_probs"_a = true, "The old-log-prob version of every token.");
}

}  // namespace

py::dict result_dict(const ulorl::policy_loss_result& r) {
  const auto& m = r.metrics;
  py::dict d("loss"_a = r.loss, "pg_loss"_a = r.pg_loss, "kl_loss"_a = r.kl_loss, "entropy_loss"_a = r.entropy_loss,
             "clip_fraction"_a = m.clip_fraction(), "clip_low_fraction"_a = m.clip_low_fraction(),
             "clip_high_fraction"_a = m.clip_high_fraction(), "clip_region_fraction"_a = m.clip_region_fraction(),
             "dual_clip_fraction"_a = m.dual_clip_fraction(), "approx_kl_k1"_a = m.approx_kl_k1(),
             "approx_kl_k1_clamped"_a = m.approx_kl_k1_clamped(), "approx_kl_k3"_a = m.approx_kl_k3_mean(),
             "ratio_mean"_a = m.ratio_mean(), "ratio_min"_a = m.ratio_min, "ratio_max"_a = m.ratio_max,
             "kl_mean"_a = m.kl_mean(), "entropy_mean"_a = m.entropy_mean(), "tokens"_a = m.tokens,
             "sequences"_a = m.sequences, "rows"_a = m.rows, "clipped"_a = m.clipped, "clipped_low"_a = m.clipped_low,
             "clipped_high"_a = m.clipped_high, "dual_clipped"_a = m.dual_clipped);
  d["seq_clipped_low"] = m.seq_clipped_low;
  d["seq_clipped_high"] = m.seq_clipped_high;
  d["seq_clipped_region"] = m.seq_clipped_region;
  return d;
}

}  // namespace ulorl_py

PYBIND11_MODULE(_ulorl, m) {
  namespace py = pybind11;
  m.doc() = "ulorl's RLVR algorithms over torch tensors (the compiled part of the `ulorl` package).";
  ulorl_py::error_type = PyErr_NewExceptionWithDoc(
      "ulorl.Error",
      "Raised for every rejected input (ulorl::error). A ValueError; the message names the function, the argument, "
      "the offending index and value. Attributes: function, argument, index (-1 when none).",
      PyExc_ValueError, nullptr);
  if (!ulorl_py::error_type) throw py::error_already_set();
  m.attr("Error") = py::handle(ulorl_py::error_type);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ulorl::error& e) {
      PyObject* inst = PyObject_CallFunction(ulorl_py::error_type, "s", e.what());
      if (!inst) return;
      PyObject_SetAttrString(inst, "function", py::str(e.function()).ptr());
      PyObject_SetAttrString(inst, "argument", py::str(e.argument()).ptr());
      PyObject_SetAttrString(inst, "index", py::int_(e.index()).ptr());
      PyErr_SetObject(ulorl_py::error_type, inst);
      Py_DECREF(inst);
    }
  });
  ulorl_py::bind_config(m);
  ulorl_py::bind_presets(m);
  ulorl_py::bind_controllers(m);
  ulorl_py::bind_scheduler(m);
  ulorl_py::bind_losses(m);
  ulorl_py::bind_logits(m);
  ulorl_py::bind_corrections(m);
}
