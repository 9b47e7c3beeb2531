// logits_isa_probe.hpp — the logits kernels (logits_forward, logits_backward) built for two
// instruction sets in one program (tests/isa/test_logits_isa.cpp): logits_isa_portable.cpp with
// the default flags, logits_isa_avx2.cpp with -mavx2 -mfma. Each probe runs both directions on the
// caller's data; the data and the comparisons live in the test, so no probe runs before the CPU check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace logits_isa {

//! One problem: logits [n, v] (double, converted to the run's logits type), labels, temperature,
//! and the backward's inputs (statistics and row gradients, converted to S and D).
struct problem {
  std::size_t n = 0, v = 0;
  std::vector<double> x;
  std::vector<std::int64_t> labels;
  double temperature = 1.0;
  std::vector<double> lse, entropy, g_lp, g_ent;  //!< g_ent empty: no entropy term
};

//! Element types of one run: logits L, labels I, statistics S, row gradients D (grad_logits: L).
//! The (L, I, S, D) of the torch adapter: policy_loss_from_logits with float32 tokens, logits_statistics
//! (double statistics) of bfloat16 and float32 logits, float64 throughout.
enum class types { f32_i64_f32_f32, bf16_i64_f64_f32, f32_i32_f64_f32, f64_i32_f64_f64 };

//! Everything a run writes, widened to double.
struct result {
  std::vector<double> log_prob, entropy, lse, sum_pi_squared;  //!< logits_forward
  std::vector<double> grad;                                    //!< logits_backward
};

//! logits_forward then logits_backward (from the problem's statistics, not the forward's) for `ty`,
//! built with this TU's flags; `threaded`: on ulorl::thread_executor{2}.
result portable(const problem& p, types ty, bool threaded);  // default flags
result avx2(const problem& p, types ty, bool threaded);      // -mavx2 -mfma

//! ulorl::install_kernel of every `types` entry
//! with this TU's kernels (on) or nullptr (off): every TU's logits kernels of those types then run
//! this TU's.
void install_avx2(bool on);

//! policy_loss_from_logits (float32 logits, int64 labels, float32 tokens, uint8 mask, PPO with an
//! entropy bonus, token mean) in the default-flags TU, on p.x and p.labels with the given old
//! log-probs and advantages.
struct fused_result {
  double loss = 0;
  std::vector<double> log_prob, entropy, lse, grad_log_prob, grad_entropy, grad_logits;
};
fused_result portable_from_logits(const problem& p, const std::vector<double>& old_log_prob,
                                  const std::vector<double>& advantages);

}  // namespace logits_isa
