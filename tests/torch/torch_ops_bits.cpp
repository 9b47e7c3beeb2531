// torch_ops_bits: the results of th::policy_loss, th::logits_statistics and the batch functions
// (group advantages and their broadcast, REINFORCE++, the off-policy mask, the rollout correction,
// DPPO's weights)
// on inputs given by integer formulas, printed as JSON with every number in C's hexadecimal float format (exact). The Python
// test tests/python/test_ops.py builds the same inputs, calls the same operators through `import
// ulorl` and compares bit for bit (CTest passes this program's path as ULORL_TORCH_OPS_BITS).
#include <ATen/ATen.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "ulorl/adapters/torch.hpp"
#include "ulorl/presets/verl.hpp"

namespace {

namespace th = ulorl::th;

constexpr std::int64_t B = 3, T = 7, N = 6, V = 11;

// The same formulas as tests/python/test_ops.py's `_bits_inputs`.
at::Tensor tokens(double (*f)(std::int64_t), c10::ScalarType dtype) {
  std::vector<double> v(static_cast<std::size_t>(B * T));
  for (std::int64_t i = 0; i < B * T; ++i) v[static_cast<std::size_t>(i)] = f(i);
  return at::tensor(v, at::kDouble).reshape({B, T}).to(dtype);
}
double lp_of(std::int64_t i) { return -0.05 * static_cast<double>(i % 11) - 0.3; }
double old_of(std::int64_t i) { return lp_of(i) + 0.01 * static_cast<double>((i * 7) % 5 - 2); }
double adv_of(std::int64_t i) { return static_cast<double>((i * 3) % 7 - 3) / 3.0; }
double mask_of(std::int64_t i) { return (i * 5) % 9 != 0 ? 1.0 : 0.0; }
double ref_of(std::int64_t i) { return lp_of(i) - 0.02 * static_cast<double>(i % 3 - 1); }
double ent_of(std::int64_t i) { return 0.5 + 0.1 * static_cast<double>(i % 4); }

//! Rollout weights for the token-selection passes: the entropy formula's values.
at::Tensor ent_weights() { return tokens(ent_of, at::kDouble); }

std::string hex(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "\"%a\"", x);
  return buf;
}
std::string hex_list(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous().reshape({-1});
  std::string s = "[";
  for (std::int64_t i = 0; i < d.numel(); ++i) s += (i ? "," : "") + hex(d.data_ptr<double>()[i]);
  return s + "]";
}

std::string policy_loss_case(c10::ScalarType dtype) {
  const at::Tensor lp = tokens(lp_of, dtype).requires_grad_(true), ent = tokens(ent_of, dtype).requires_grad_(true);
  const at::Tensor mask = tokens(mask_of, at::kDouble).to(at::kBool);
  ulorl::policy_loss_config cfg;
  cfg.objective.eps_high = 0.28;
  cfg.kl_coef = 0.05;
  cfg.entropy_coef = 0.01;
  cfg.normalizer.denominator = mask.sum().item<double>();
  const auto out = th::policy_loss(lp, tokens(old_of, dtype), tokens(adv_of, dtype), mask, cfg,
                                   {.ref_log_prob = tokens(ref_of, dtype), .entropy = ent});
  out.loss.backward();
  std::vector<double> result(ulorl::encoded_result_size);
  ulorl::encode_result(out.result, result);
  return "{\"loss\":" + hex(out.loss.item<double>()) + ",\"result\":" + hex_list(at::tensor(result, at::kDouble)) +
         ",\"grad_log_prob\":" + hex_list(lp.grad()) + ",\"grad_entropy\":" + hex_list(ent.grad()) + "}";
}

std::string logits_case(c10::ScalarType dtype) {
  std::vector<double> z(static_cast<std::size_t>(N * V));
  std::vector<std::int64_t> y(static_cast<std::size_t>(N));
  for (std::int64_t i = 0; i < N; ++i) {
    y[static_cast<std::size_t>(i)] = (i * 5) % V;
    for (std::int64_t v = 0; v < V; ++v)
      z[static_cast<std::size_t>(i * V + v)] = static_cast<double>((i * 31 + v * 17) % 23) / 4.0 - 2.5;
  }
  const at::Tensor logits = at::tensor(z, at::kDouble).reshape({N, V}).to(dtype).requires_grad_(true);
  auto [lp, ent] = th::logits_statistics(logits, at::tensor(y, at::kLong), 0.7);
  (lp.sum() + 0.5 * ent.sum()).backward();
  return "{\"log_prob\":" + hex_list(lp) + ",\"entropy\":" + hex_list(ent) +
         ",\"grad_logits\":" + hex_list(logits.grad()) + "}";
}

//! The batch functions on the policy-loss inputs (float64), each with its default or a preset's
//! configuration: rewards r_b = ((b * 3) % 5) / 4 of 3 responses in one group.
std::string batch_case() {
  const at::Tensor old = tokens(old_of, at::kDouble), lp = tokens(lp_of, at::kDouble),
                   ref = tokens(ref_of, at::kDouble);
  const at::Tensor mask = tokens(mask_of, at::kDouble).to(at::kBool), adv_tok = tokens(adv_of, at::kDouble);
  const at::Tensor rewards = at::tensor(std::vector<double>{0.0, 0.75, 0.25}, at::kDouble);
  const auto preset = ulorl::presets::verl::grpo_advantage();
  const at::Tensor adv = th::group_advantages(rewards, std::int64_t{3}, preset);
  const at::Tensor tok = th::broadcast_to_tokens(adv, mask, preset);
  const auto [rpp_adv, rpp_ret] = th::reinforce_plus_plus_advantages(adv_tok, mask, 0.9, "skip_masked");
  const auto opm = th::off_policy_mask(lp, old, adv, mask, {.delta = 0.01});
  const auto rc = th::rollout_correction(old, ref, mask, {});
  const auto dppo = th::dppo_weights(old, lp, adv_tok, mask, ent_weights(), {.delta_low = 0.02, .delta_high = 0.03});
  return "{\"advantages\":" + hex_list(adv) + ",\"tokens\":" + hex_list(tok) +
         ",\"reinforce_plus_plus\":" + hex_list(rpp_adv) + ",\"returns\":" + hex_list(rpp_ret) +
         ",\"opm_keep\":" + hex_list(opm.keep) + ",\"opm_seq_kl\":" + hex_list(opm.seq_kl) +
         ",\"rc_weights\":" + hex_list(rc.weights) + ",\"rc_keep\":" + hex_list(rc.keep) +
         ",\"rc_kl\":" + hex(rc.metrics.kl) + ",\"dppo_weights\":" + hex_list(dppo.out) +
         ",\"dppo_dropped\":" + hex(dppo.stats.dropped_fraction) + "}";
}

}  // namespace

int main() {
  std::printf(
      "{\"policy_loss\":{\"float32\":%s,\"float64\":%s},\"logits_statistics\":{\"float32\":%s,\"float64\":%s,"
      "\"bfloat16\":%s,\"float16\":%s},\"batch\":%s}\n",
      policy_loss_case(at::kFloat).c_str(), policy_loss_case(at::kDouble).c_str(), logits_case(at::kFloat).c_str(),
      logits_case(at::kDouble).c_str(), logits_case(at::kBFloat16).c_str(), logits_case(at::kHalf).c_str(),
      batch_case().c_str());
  return 0;
}
