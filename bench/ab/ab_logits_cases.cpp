// bench/ab/ab_logits_cases.cpp — the logits cases of bench_logits_ab (one thread): what
// bench/bench_logits.cpp measures (logits_forward, logits_backward default and fast_backward,
// forward + backward; float and bf16 logits) plus the fused policy_loss_from_logits (clip-higher
// 0.2 / 0.28 + k3 KL with verl's clamps, token-mean; with and without an entropy term), on
// N = 512 rows x V = 32768 and, for the forward and the fused loss, N = 128 x V = 151936 (Qwen).
//
// Compiled twice into one program like ab_loss_cases.cpp (see there and bench/ab/README.md):
// ab::side_new against the current include/, ab::side_old against the baseline's in ulorl::v0_base.
// Both sides read the same arrays (ab_data.cpp; bf16 logits as bit patterns). The backward's saved
// statistics are the exact float64 ones of ab_data.cpp, not either side's forward, so both sides get
// the same input. Names: logits/<op>/<type>/N<rows>xV<vocab>/<side>.
#include <ulorl/logits.hpp>

#include "ab_common.hpp"

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ab_side.hpp"

namespace ab::AB_SIDE_NS {
namespace {

static_assert(sizeof(ulorl::bf16) == sizeof(std::uint16_t) && std::is_trivially_copyable_v<ulorl::bf16>,
              "ab_data.cpp stores bf16 logits as their 16-bit patterns");

enum class op { forward, backward, backward_fast, fwd_bwd, from_logits, from_logits_entropy };

struct logits_case {
  std::string name;
  op what;
  bool bf16;
  std::size_t rows, vocab;
  //! The logits' NaN/Inf scan: off on both sides (the work both share), on on both sides, or each
  //! side's default configuration (what a caller who sets nothing gets).
  enum scan_mode { off, on, side_default } scan = off;
};

template <class L>
const L* logits_of(const ab::logits_arrays& d) {
  if constexpr (std::is_same_v<L, float>) return d.logits;
  else return reinterpret_cast<const ulorl::bf16*>(d.logits_bf16);
}
template <class L>
L* grad_of(const ab::logits_arrays& d) {
  if constexpr (std::is_same_v<L, float>) return d.grad;
  else return reinterpret_cast<ulorl::bf16*>(d.grad_bf16);
}

//! The logits configuration with the logits' NaN/Inf scan on, off or left at the side's default,
//! whichever the side names it (`check_values`, on by default; before the single vocabulary
//! `check_logits`, off by default).
template <class C>
C logits_scan(logits_case::scan_mode scan) {
  C c;
  if (scan == logits_case::side_default) return c;
  if constexpr (requires(C& x) { x.check_values; }) c.check_values = scan == logits_case::on;
  else c.check_logits = scan == logits_case::on;
  return c;
}

template <class L>
void forward(const ab::logits_arrays& d, const ulorl::logits_config& lcfg) {
  ulorl::logits_forward(ulorl::matrix_view<const L>(logits_of<L>(d), d.rows, d.vocab),
                        std::span<const std::int64_t>(d.labels, d.rows), ulorl::vector_view<double>(d.out_log_prob, d.rows),
                        ulorl::vector_view<double>(d.out_entropy, d.rows), ulorl::vector_view<double>(d.out_lse, d.rows), lcfg);
}
template <class L>
void backward(const ab::logits_arrays& d, bool fast, ulorl::logits_config lcfg) {
  lcfg.fast_backward = fast;
  ulorl::logits_backward(ulorl::matrix_view<const L>(logits_of<L>(d), d.rows, d.vocab),
                         std::span<const std::int64_t>(d.labels, d.rows), ulorl::vector_view<const double>(d.lse, d.rows),
                         ulorl::vector_view<const double>(d.entropy, d.rows),
                         ulorl::vector_view<const double>(d.grad_log_prob, d.rows),
                         ulorl::vector_view<const double>(d.grad_entropy, d.rows),
                         ulorl::matrix_view<L>(grad_of<L>(d), d.rows, d.vocab), lcfg);
}

//! The fused loss on d's tokens (padded responses of d.response_len); returns the loss.
template <class L>
double from_logits(const ab::logits_arrays& d, const ulorl::policy_loss_config& cfg, const ulorl::logits_config& lcfg) {
  const auto tv = [&](auto* p) {
    using E = std::remove_pointer_t<decltype(p)>;
    return ulorl::token_view<E>::padded(ulorl::matrix_view<E>(p, d.responses, d.response_len));
  };
  ulorl::policy_loss_inputs<float, std::uint8_t> in;
  in.old_log_prob = tv(d.old_log_prob);
  in.advantages = tv(d.advantages);
  in.mask = tv(d.mask);
  in.ref_log_prob = tv(d.ref_log_prob);
  ulorl::logits_loss_buffers<float> buf;
  buf.log_prob = tv(d.buf_log_prob);
  buf.grad_log_prob = tv(d.buf_grad_log_prob);
  if (cfg.entropy_coef != 0.0) buf.entropy = tv(d.buf_entropy), buf.grad_entropy = tv(d.buf_grad_entropy);
  buf.lse = ulorl::vector_view<float>(d.buf_lse, d.rows);
  const ulorl::matrix_view<const L> logits(logits_of<L>(d), d.rows, d.vocab);
  const std::span<const std::int64_t> labels(d.labels, d.rows);
  const ulorl::matrix_view<L> grad(grad_of<L>(d), d.rows, d.vocab);
  // The configuration last; a baseline from before the single argument order takes it after `in`.
  if constexpr (requires { ulorl::policy_loss_from_logits(logits, labels, in, buf, grad, cfg); })
    return ulorl::policy_loss_from_logits(logits, labels, in, buf, grad, cfg, lcfg).loss;
  else
    return ulorl::policy_loss_from_logits(logits, labels, in, cfg, buf, grad, lcfg).loss;
}

ulorl::policy_loss_config loss_config(const ab::logits_arrays& d, bool entropy) {
  ulorl::policy_loss_config c;
  c.objective.kind = ulorl::objective_kind::ppo_clip;
  c.objective.eps_low = 0.2, c.objective.eps_high = 0.28, c.objective.log_ratio_clamp = 20.0;
  c.kl.estimator = ulorl::kl_estimator::k3, c.kl.input_clamp = 20.0, c.kl.output_clamp = 10.0;
  c.kl_coef = 0.04;
  c.entropy_coef = entropy ? 0.001 : 0.0;
  double tokens = 0;
  for (std::size_t i = 0; i < d.rows; ++i) tokens += d.mask[i];
  c.normalizer.mode = ulorl::agg_mode::token_mean;
  c.normalizer.denominator = tokens;
  c.normalizer.scale = 1.0;
  return c;
}

//! One call of the case; returns a value to compare across the sides (loss or a statistic).
template <class L>
double call(const logits_case& c, const ab::logits_arrays& d, const ulorl::policy_loss_config& cfg) {
  const auto lcfg = logits_scan<ulorl::logits_config>(c.scan);
  switch (c.what) {
    case op::forward: forward<L>(d, lcfg); return d.out_lse[d.rows - 1];
    case op::backward: backward<L>(d, false, lcfg); return 0;
    case op::backward_fast: backward<L>(d, true, lcfg); return 0;
    case op::fwd_bwd: forward<L>(d, lcfg), backward<L>(d, false, lcfg); return d.out_lse[d.rows - 1];
    case op::from_logits:
    case op::from_logits_entropy: return from_logits<L>(d, cfg, lcfg);
  }
  return 0;
}

template <class L>
ab::prepared_case prepare(const logits_case& c) {
  const auto& d = ab::logits_data(c.rows, c.vocab);
  const auto cfg = loss_config(d, c.what == op::from_logits_entropy);
  ab::prepared_case p;
  p.call = [c, &d, cfg]() { return call<L>(c, d, cfg); };
  // Logit bytes per logit: read (forward); read + write (backward); read, read + write (the others).
  const std::size_t passes = c.what == op::forward ? 1 : (c.what == op::backward || c.what == op::backward_fast ? 2 : 3);
  p.items = static_cast<double>(c.rows * c.vocab);
  p.bytes = p.items * static_cast<double>(passes * sizeof(L));
  return p;
}

std::vector<logits_case> cases() {
  constexpr std::size_t n = 512, v = 32768, qn = 128, qv = 151936;
  return {
      {"forward/f32", op::forward, false, n, v},
      {"forward/bf16", op::forward, true, n, v},
      {"backward/f32", op::backward, false, n, v},
      {"backward_fast/f32", op::backward_fast, false, n, v},
      {"backward/bf16", op::backward, true, n, v},
      {"fwd_bwd/f32", op::fwd_bwd, false, n, v},
      {"from_logits/f32", op::from_logits, false, n, v},
      {"from_logits_entropy/f32", op::from_logits_entropy, false, n, v},
      {"from_logits/bf16", op::from_logits, true, n, v},
      {"forward/f32", op::forward, false, qn, qv},
      {"from_logits/f32", op::from_logits, false, qn, qv},
      {"forward_scan/f32", op::forward, false, n, v, logits_case::on},
      {"from_logits_scan/f32", op::from_logits, false, n, v, logits_case::on},
      {"forward_default/f32", op::forward, false, n, v, logits_case::side_default},
      {"forward_default/bf16", op::forward, true, n, v, logits_case::side_default},
      {"backward_default/f32", op::backward, false, n, v, logits_case::side_default},
      {"fwd_bwd_default/f32", op::fwd_bwd, false, n, v, logits_case::side_default},
      {"from_logits_default/f32", op::from_logits, false, n, v, logits_case::side_default},
      {"from_logits_default/f32", op::from_logits, false, qn, qv, logits_case::side_default},
  };
}

}  // namespace

void register_cases() {
  for (const auto& c : cases()) {
    ab::side_case e;
    e.name = "logits/" + c.name + "/N" + std::to_string(c.rows) + "xV" + std::to_string(c.vocab);
    e.prepare = [c]() { return c.bf16 ? prepare<ulorl::bf16>(c) : prepare<float>(c); };
    ab::add_case(AB_SIDE_NAME, std::move(e));
  }
}

}  // namespace ab::AB_SIDE_NS
