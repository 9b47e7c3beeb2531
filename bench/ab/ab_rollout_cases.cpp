// bench/ab/ab_rollout_cases.cpp — the rollout-correction cases of an A/B benchmark (bench_rollout_ab):
// bench_loss_features.cpp's rc_* rows on bench_loss.cpp's data (float, 4M tokens in 8192-token
// rows, ragged uint8 masks, one thread), each side's code run alternately in one process by
// ab_main.cpp (bench/ab/README.md). Names: rc/<case>/<side>.
//   rc/plain        the plain fused loss (clip-higher 0.2/0.28 + k3 KL with verl's clamps + token-mean)
//   rc/apply        rollout_correction::apply alone (TRL token_truncate, clip_max 3): weights + keep-mask
//   rc/in_loss      the loss with that correction inside (policy_loss_config::rollout)
//   rc/rs_in_loss   rc/in_loss with a rejection chain (token k2, sequence-mean k3): the statistics
//                   pass (rollout_correction::accumulate) for the kept-token normaliser, then the loss
//   rc/verl_in_loss the loss with verl's token TIS (threshold 2, log-ratio clamp 20) inside
// The rollout log-probs are old + U(-0.1, 0.1), drawn from a hash of the index (the same on both sides).
//
// Built like the other case files (two objects, -DAB_SIDE=new / -DAB_SIDE=old
// -DULORL_ABI_NAMESPACE=v0_base with the baseline's include/ first), e.g. by hand:
//   for s in new old; do g++ -std=c++20 -O2 -march=native -DAB_SIDE=$s [-DULORL_ABI_NAMESPACE=v0_base
//     -I <baseline>/include] -I include -I bench -I bench/ab -c bench/ab/ab_rollout_cases.cpp -o rc_$s.o; done
//   g++ -std=c++20 -O2 -march=native -I bench -I bench/ab bench/ab/ab_main.cpp bench/ab/ab_data.cpp rc_new.o rc_old.o
//     -lbenchmark -lpthread -o bench_rollout_ab
//   ./bench_rollout_ab --ab_paired
#include <ulorl/loss/policy_loss.hpp>
#include <ulorl/loss/rollout_correction.hpp>
#include <ulorl/presets/trl.hpp>

#include "ab_common.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ab_side.hpp"

namespace ab::AB_SIDE_NS {
namespace {

constexpr std::size_t tokens = std::size_t{1} << 22;

//! old + U(-0.1, 0.1) from splitmix64(i): no ulorl code, identical on both sides.
const std::vector<float>& rollout_log_prob() {
  static const std::vector<float> v = [] {
    const auto& d = ab::loss_data<float>(tokens);
    std::vector<float> r(d.tokens);
    for (std::size_t i = 0; i < d.tokens; ++i) {
      std::uint64_t z = i + 0x9e3779b97f4a7c15ull;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      const double u = static_cast<double>(z >> 11) * 0x1p-53;
      r[i] = static_cast<float>(d.old_log_prob[i] + (u - 0.5) * 0.2);
    }
    return r;
  }();
  return v;
}

ulorl::rollout_correction::config trl_token_truncate() {
  namespace trl = ulorl::presets::trl;
  return trl::rollout_correction({.vllm_importance_sampling_mode = trl::importance_sampling_mode::token_truncate});
}

ab::prepared_case prepare(const std::string& name) {
  const auto& d = ab::loss_data<float>(tokens);
  const auto view = [&](const auto* p) {
    using E = std::remove_cv_t<std::remove_pointer_t<decltype(p)>>;
    return ulorl::token_view<const E>::padded(ulorl::matrix_view<const E>(p, d.rows, ab::loss_row_len));
  };
  const auto& ro = rollout_log_prob();
  ulorl::policy_loss_inputs<float, std::uint8_t> in;
  in.log_prob = view(d.log_prob), in.old_log_prob = view(d.old_log_prob), in.advantages = view(d.advantages);
  in.mask = view(d.mask), in.ref_log_prob = view(d.ref_log_prob);
  ulorl::policy_loss_config cfg;
  cfg.objective.eps_low = 0.2, cfg.objective.eps_high = 0.28, cfg.objective.log_ratio_clamp = 20.0;
  cfg.kl.estimator = ulorl::kl_estimator::k3, cfg.kl.input_clamp = 20.0, cfg.kl.output_clamp = 10.0;
  cfg.kl_coef = 0.04;
  cfg.normalizer.mode = ulorl::agg_mode::token_mean, cfg.normalizer.denominator = d.valid_tokens, cfg.normalizer.scale = 1.0;
  const auto grad = ulorl::token_view<float>::padded(ulorl::matrix_view<float>(d.grad_log_prob, d.rows, ab::loss_row_len));
  const ulorl::rollout_correction::inputs<float, std::uint8_t> rin{in.old_log_prob, view(ro.data()), in.mask};
  auto rc = trl_token_truncate();
  auto rs = rc;
  rs.rejection.chain.push_back({ulorl::rollout_correction::rs_statistic::token, ulorl::rollout_correction::rs_estimator::k2, 0.0, 0.004});
  rs.rejection.chain.push_back({ulorl::rollout_correction::rs_statistic::sequence_mean, ulorl::rollout_correction::rs_estimator::k3, 0.0, 0.002});
  ulorl::rollout_correction::config verl;  // token TIS, upper 2, clamp 20
  ab::prepared_case p;
  p.items = static_cast<double>(d.tokens);
  p.bytes = p.items * (5 * sizeof(float) + 1.0);
  if (name == "plain") {
    p.call = [in, cfg, grad] { return ulorl::policy_loss(in, grad, cfg).loss; };
  } else if (name == "apply") {
    auto w = std::make_shared<std::vector<float>>(d.tokens);
    auto k = std::make_shared<std::vector<std::uint8_t>>(d.tokens);
    p.call = [rin, rc, w, k, &d] {
      const auto out = ulorl::rollout_correction::outputs<float, std::uint8_t>{
          ulorl::token_view<float>::padded(ulorl::matrix_view<float>(w->data(), d.rows, ab::loss_row_len)),
          ulorl::token_view<std::uint8_t>::padded(ulorl::matrix_view<std::uint8_t>(k->data(), d.rows, ab::loss_row_len))};
      return ulorl::rollout_correction::apply(rin, out, rc).kl;
    };
    p.bytes = p.items * (2 * sizeof(float) + 1.0 + sizeof(float) + 1.0);
  } else {
    auto run = in;
    run.rollout_log_prob = rin.rollout_log_prob;
    auto c = cfg;
    c.rollout = name == "in_loss" ? rc : name == "rs_in_loss" ? rs : verl;
    const bool accumulate = name == "rs_in_loss";
    p.call = [run, c, grad, rin, accumulate] {
      auto cc = c;
      if (accumulate) {
        const auto s = ulorl::rollout_correction::accumulate(rin, ulorl::rollout_correction::outputs<float, std::uint8_t>{}, *cc.rollout);
        cc.normalizer.denominator = s.tokens - s.rejected_tokens;
      }
      return ulorl::policy_loss(run, grad, cc).loss;
    };
    p.bytes = p.items * (6 * sizeof(float) + 1.0);
  }
  return p;
}

}  // namespace

void register_cases() {
  for (const char* name : {"plain", "apply", "in_loss", "rs_in_loss", "verl_in_loss"}) {
    ab::side_case e;
    e.name = std::string("rc/") + name;
    e.prepare = [n = std::string(name)] { return prepare(n); };
    ab::add_case(AB_SIDE_NAME, std::move(e));
  }
}

}  // namespace ab::AB_SIDE_NS
