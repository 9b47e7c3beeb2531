// bench/ab/ab_loss_cases.cpp — the policy-loss cases of bench_loss_ab: ulorl::policy_loss (forward,
// backward, metrics; one thread) over bench_loss.cpp's data. Each side adds its table of cases
// (ab_common.hpp); the driver (ab_main.cpp) registers one benchmark per case and side.
//
// Compiled twice into one program (bench/CMakeLists.txt): with -DAB_SIDE=new against the current
// include/, and with -DAB_SIDE=old -DULORL_ABI_NAMESPACE=v0_base against the baseline's include/
// (ULORL_BENCH_BASELINE_INCLUDE, prepended). The two copies of ulorl then live in ulorl::v0 and
// ulorl::v0_base, this file's code in ab::side_new / ab::side_old and, inside, an anonymous
// namespace, so no definition of one side can merge with the other's at link time. Both sides read
// the same arrays (ab_data.cpp). Names: loss/<type>/<objective>/<kl>[/<variant>]/<side>.
//
// Written against the policy_loss API of 902da99 (policy_loss_inputs, policy_loss_config,
// objective_config, kl_config, agg_normalizer); the configuration is set member by member, so a
// reordering of the structs' fields does not matter, a renamed field fails to compile here.
#include <ulorl/loss/policy_loss.hpp>

#include "ab_common.hpp"

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ab_side.hpp"

namespace ab::AB_SIDE_NS {
namespace {

struct loss_case {
  std::string name;
  bool f64 = false;
  std::size_t tokens = std::size_t{1} << 20;
  bool packed = false;
  bool weights = false;
  bool seq_normalizer = false;  //!< denominator: sequences (gmpo; seq_mean_token_mean), else tokens
  ulorl::policy_loss_config cfg{};
};

// ---- the configurations -----------------------------------------------------------------------------
ulorl::objective_config objective(const std::string& name) {
  ulorl::objective_config o;
  o.eps_low = 0.2, o.eps_high = 0.28, o.log_ratio_clamp = 20.0;  // clip-higher (DAPO)
  if (name == "ppo_clip") {
    o.kind = ulorl::objective_kind::ppo_clip;
  } else if (name == "ppo_dual_clip3") {
    o.kind = ulorl::objective_kind::ppo_clip, o.dual_clip = 3.0;
  } else if (name == "cispo") {
    o.kind = ulorl::objective_kind::cispo;
  } else if (name == "sapo") {
    o.kind = ulorl::objective_kind::sapo;
  } else if (name == "policy_gradient") {
    o.kind = ulorl::objective_kind::policy_gradient;
  } else if (name == "gspo_own_token" || name == "gspo_through_mean") {
    o.kind = ulorl::objective_kind::gspo, o.eps_low = 3e-4, o.eps_high = 4e-4;  // the GSPO paper's
    o.gspo.seq_gradient =
        name == "gspo_own_token" ? ulorl::sequence_gradient::own_token : ulorl::sequence_gradient::through_mean;
  } else if (name == "gmpo") {
    o.kind = ulorl::objective_kind::gmpo, o.eps_low = 0.4, o.eps_high = 0.4;
  } else {
    throw std::invalid_argument("ab_loss_cases: unknown objective " + name);
  }
  return o;
}

//! "off", "k3" (verl: clamps 20 / 10), "k1", "k2", "abs" (unclamped), "k3_iw" (k3 * ratio, TRL).
void set_kl(ulorl::policy_loss_config& c, const std::string& kl) {
  if (kl == "off") {
    c.kl_coef = 0.0;
    return;
  }
  c.kl_coef = 0.04;
  ulorl::kl_config k;
  if (kl == "k3" || kl == "k3_iw") {
    k.estimator = ulorl::kl_estimator::k3, k.input_clamp = 20.0, k.output_clamp = 10.0;
    k.importance_weighted = kl == "k3_iw";
  } else if (kl == "k1") {
    k.estimator = ulorl::kl_estimator::k1;
  } else if (kl == "k2") {
    k.estimator = ulorl::kl_estimator::k2;
  } else if (kl == "abs") {
    k.estimator = ulorl::kl_estimator::abs;
  } else {
    throw std::invalid_argument("ab_loss_cases: unknown kl " + kl);
  }
  c.kl = k;
}

loss_case make_case(bool f64, const std::string& obj, const std::string& kl, const std::string& variant = "") {
  loss_case c;
  c.f64 = f64;
  c.name = std::string(f64 ? "f64/" : "f32/") + obj + "/" + kl + (variant.empty() ? "" : "/" + variant);
  c.cfg.objective = objective(obj);
  set_kl(c.cfg, kl);
  c.cfg.normalizer.mode = ulorl::agg_mode::token_mean;
  if (obj == "gmpo") c.cfg.normalizer.mode = ulorl::agg_mode::seq_mean_token_mean, c.seq_normalizer = true;
  if (variant == "packed")
    c.packed = true;
  else if (variant == "weights")
    c.weights = true;
  else if (variant == "entropy")
    c.cfg.entropy_coef = 0.001;
  else if (variant == "unchecked")
    c.cfg.check_values = false;
  else if (variant == "seq_mean_token_mean")
    c.cfg.normalizer.mode = ulorl::agg_mode::seq_mean_token_mean, c.seq_normalizer = true;
  else if (variant == "16M")
    c.tokens = std::size_t{1} << 24;
  else if (!variant.empty())
    throw std::invalid_argument("ab_loss_cases: unknown variant " + variant);
  return c;
}

std::vector<loss_case> cases() {
  const std::vector<std::string> objectives = {
      "ppo_clip", "ppo_dual_clip3", "cispo", "sapo", "policy_gradient", "gspo_own_token", "gspo_through_mean", "gmpo"};
  std::vector<loss_case> v;
  // Padded layout, 1M tokens (128 rows of 8192): every objective without and with verl's k3 KL.
  for (const auto& o : objectives)
    for (const char* kl : {"off", "k3"}) v.push_back(make_case(false, o, kl));
  for (const auto& o : objectives) v.push_back(make_case(true, o, "k3"));
  v.push_back(make_case(true, "ppo_clip", "off"));
  // One case each: the other estimators, importance-weighted KL, weights, entropy, trusted inputs,
  // the packed layout, the per-sequence normaliser, 16M tokens.
  for (const char* kl : {"k1", "k2", "abs", "k3_iw"}) v.push_back(make_case(false, "ppo_clip", kl));
  for (const char* var : {"weights", "entropy", "unchecked", "packed", "seq_mean_token_mean", "16M"})
    v.push_back(make_case(false, "ppo_clip", "k3", var));
  v.push_back(make_case(true, "ppo_clip", "k3", "packed"));
  return v;
}

// ---- one case made ready to run -----------------------------------------------------------------------
template <class T>
ab::prepared_case prepare(const loss_case& c) {
  const auto& d = ab::loss_data<T>(c.tokens);
  const std::span<const std::int64_t> offsets(d.offsets, d.rows + 1);
  const auto view = [&](auto* p) {
    using E = std::remove_pointer_t<decltype(p)>;
    return c.packed ? ulorl::token_view<E>::packed(ulorl::vector_view<E>(p, d.tokens), offsets)
                    : ulorl::token_view<E>::padded(ulorl::matrix_view<E>(p, d.rows, ab::loss_row_len));
  };
  ulorl::policy_loss_inputs<T, std::uint8_t> in;
  in.log_prob = view(d.log_prob);
  in.old_log_prob = view(d.old_log_prob);
  in.advantages = view(d.advantages);
  in.mask = view(d.mask);
  if (c.cfg.kl_coef != 0.0) in.ref_log_prob = view(d.ref_log_prob);
  if (c.weights) in.weights = view(d.weights);
  const bool with_entropy = c.cfg.entropy_coef != 0.0;
  if (with_entropy) in.entropy = view(d.entropy);
  const auto grad = view(d.grad_log_prob);
  const auto grad_entropy = with_entropy ? view(d.grad_entropy) : ulorl::token_view<T>();
  ulorl::policy_loss_config cfg = c.cfg;
  cfg.normalizer.denominator = c.seq_normalizer ? d.sequences : d.valid_tokens;
  cfg.normalizer.scale = 1.0;

  ab::prepared_case p;
  p.call = [in, cfg, grad, grad_entropy]() {
    // The configuration last; a baseline from before the single argument order takes it second.
    if constexpr (requires { ulorl::policy_loss(in, grad, grad_entropy, cfg); })
      return ulorl::policy_loss(in, grad, grad_entropy, cfg).loss;
    else
      return ulorl::policy_loss(in, cfg, grad, grad_entropy).loss;
  };
  p.items = static_cast<double>(d.tokens);
  // Bytes per token: the inputs read (a one-byte mask) and the gradients written.
  const double arrays = 3.0 + (cfg.kl_coef != 0.0) + c.weights + 2.0 * with_entropy + 1.0;
  p.bytes = p.items * (arrays * sizeof(T) + 1.0);
  return p;
}

}  // namespace

void register_cases() {
  for (const auto& c : cases()) {
    ab::side_case e;
    e.name = "loss/" + c.name;
    e.prepare = [c]() { return c.f64 ? prepare<double>(c) : prepare<float>(c); };
    ab::add_case(AB_SIDE_NAME, std::move(e));
  }
}

}  // namespace ab::AB_SIDE_NS
