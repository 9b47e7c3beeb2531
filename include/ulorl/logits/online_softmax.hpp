// ulorl/logits/online_softmax.hpp — the scalar math of the fused logits kernels, written once for the
// CPU loops and the CUDA kernels (ULORL_HD): an online-softmax partial state that yields the
// log-sum-exp, the chosen token's log-prob and the entropy of a row in one pass, the merge of two
// partial states (chunks, SIMD lanes, warps, vocabulary splits), and the backward coefficients.
//
// For a row of raw logits x_j, temperature tau, z_j = x_j / tau, p = softmax(z):
//   with m = max_j x_j and d_j = (x_j - m) / tau <= 0,
//   s = sum_j e^{d_j},   t = sum_j e^{d_j} d_j,
//   lse = m / tau + log s,   log_prob_y = d_y - log s,   entropy = lse - sum_j p_j z_j = log s - t / s.
// Rescaling to a new maximum m' (delta = (m - m') / tau <= 0):
//   s' = e^delta s,   t' = e^delta (t + delta s).
// Backward of L = g_lp * log_prob_y + g_ent * entropy (verl's formula, golden README section 4.6):
//   dL/dx_j = (g_lp (delta_{jy} - p_j) - g_ent p_j (z_j - E)) / tau,  z_j - E = log p_j + entropy,
//   i.e. p_j (a + b log p_j) + delta_{jy} g_lp / tau with a = -(g_lp + g_ent H) / tau, b = -g_ent / tau.
// Matches verl's entropy_from_logits / logprobs_from_logits and Liger's fused linear cross-entropy.
#pragma once

#include <cmath>
#include <limits>

#include "ulorl/core/config.hpp"

ULORL_NAMESPACE_BEGIN

//! Online-softmax state of a set of logits. `max` is a raw logit (not divided by tau); `sum` and
//! `tsum` are relative to it. The empty state (and a set of only -inf logits) has max = -inf, sum = 0.
template <class A>
struct softmax_partial {
  A max = -std::numeric_limits<A>::infinity();
  A sum = A(0);
  A tsum = A(0);

  //! Re-express the state relative to a new maximum `m >= max` (m finite or +inf).
  [[nodiscard]] ULORL_HD softmax_partial rescaled(A m, A inv_tau) const noexcept {
    if (sum == A(0) && tsum == A(0)) return {m, A(0), A(0)};  // empty: no -inf * 0
    const A delta = (max - m) * inv_tau;
    const A scale = std::exp(delta);
    return {m, scale * sum, scale * (tsum + delta * sum)};
  }
};

//! Merge two partial states (associative and commutative up to rounding).
template <class A>
[[nodiscard]] ULORL_HD softmax_partial<A> merge(const softmax_partial<A>& a, const softmax_partial<A>& b,
                                                A inv_tau) noexcept {
  if (!(b.max > a.max)) {  // also when b is empty or b.max is NaN (then the sums carry the NaN)
    if (b.sum == A(0) && b.tsum == A(0)) return a;
    const softmax_partial<A> br = b.rescaled(a.max, inv_tau);
    return {a.max, a.sum + br.sum, a.tsum + br.tsum};
  }
  const softmax_partial<A> ar = a.rescaled(b.max, inv_tau);
  return {b.max, ar.sum + b.sum, ar.tsum + b.tsum};
}

//! Add one logit to a state (the scalar online-softmax step; vector code adds whole chunks).
template <class A>
[[nodiscard]] ULORL_HD softmax_partial<A> push(const softmax_partial<A>& s, A x, A inv_tau) noexcept {
  softmax_partial<A> r = s;
  if (x > r.max) r = r.rescaled(x, inv_tau);
  if (x == -std::numeric_limits<A>::infinity()) return r;  // masked vocabulary entry: p = 0 exactly
  const A d = (x - r.max) * inv_tau;
  const A e = std::exp(d);
  r.sum += e;
  r.tsum += e * d;
  return r;
}

//! Per-row statistics: log-sum-exp of z = x / tau, log-prob of the chosen token, entropy (nats).
template <class A>
struct token_stats {
  A lse;
  A log_prob;
  A entropy;
};

//! Finish a row. `x_label` is the chosen token's raw logit. A row with no finite logit (all -inf)
//! has no distribution: lse = -inf, log_prob = entropy = NaN. NaN or +inf logits give NaN results.
template <class A>
[[nodiscard]] ULORL_HD token_stats<A> finalize(const softmax_partial<A>& s, A x_label, A inv_tau) noexcept {
  const A log_s = std::log(s.sum);
  token_stats<A> r;
  if (s.max == -std::numeric_limits<A>::infinity()) {
    r.lse = s.max;
    r.log_prob = r.entropy = std::numeric_limits<A>::quiet_NaN();
    return r;
  }
  r.lse = s.max * inv_tau + log_s;
  r.log_prob = (x_label - s.max) * inv_tau - log_s;
  const A h = log_s - s.tsum / s.sum;
  r.entropy = h < A(0) ? A(0) : h;  // rounding of a one-hot row can give -1e-17; NaN passes through
  return r;
}

//! dL/dx_j = p_j (a + b log p_j) + [j == y] label_term for L = g_lp log_prob_y + g_ent entropy.
template <class A>
struct grad_coeffs {
  A a;
  A b;
  A label_term;
};
template <class A>
[[nodiscard]] ULORL_HD grad_coeffs<A> backward_coeffs(A g_log_prob, A g_entropy, A entropy, A inv_tau) noexcept {
  return {-(g_log_prob + g_entropy * entropy) * inv_tau, -g_entropy * inv_tau, g_log_prob * inv_tau};
}

//! The backward's log-probabilities log p_j = (x_j - c) / tau - r, with the anchor c in the logits'
//! arithmetic type (x_j - c is exact for x_j near c) and the shift r = log-sum-exp of the scaled
//! logits less c / tau.
template <class A>
struct log_softmax_anchor {
  A c;
  A r;
};

//! The largest |lse| from which the backward takes its anchor (c = lse * tau rounded, r = lse - c / tau):
//! a stored lse of type S places log p only to within |lse| * eps(S), i.e. 2^-33 relative in p for
//! double and 2^-14 for float at this limit. A larger |lse| (a tiny temperature, huge logits) has
//! lost the digits of log p: the backward recomputes the row's maximum and sum instead.
template <class S>
[[nodiscard]] ULORL_HD constexpr S lse_anchor_limit() noexcept {
  return sizeof(S) >= 8 ? S(1048576) : S(1024);
}

//! The anchor from a stored lse (of type S, here widened to A), with the anchor rounded to the
//! logits' arithmetic type C; `ok` is false when the stored lse cannot place log p (|lse| past
//! lse_anchor_limit<S>), or when |lse * tau| exceeds half of C's range at a huge temperature: the
//! logits stay within half of that range (the value scan), so x_j - c, evaluated in C, cannot
//! overflow while |c| does too. Then the anchor must come from the row itself, anchor_of_row.
template <class S, class C, class A>
[[nodiscard]] ULORL_HD log_softmax_anchor<A> anchor_of_lse(A lse, A tau, A inv_tau, bool& ok) noexcept {
  const A c = static_cast<A>(static_cast<C>(lse * tau));
  ok = std::fabs(lse) <= static_cast<A>(lse_anchor_limit<S>()) &&
       std::fabs(c) <= static_cast<A>(std::numeric_limits<C>::max() / 2);
  return {c, lse - c * inv_tau};
}

//! The anchor from a row's online-softmax state: c = the row maximum (a raw logit, so x_j - c is
//! exact near it), r = log sum_j e^{(x_j - c) / tau}; what torch's log_softmax subtracts.
template <class A>
[[nodiscard]] ULORL_HD log_softmax_anchor<A> anchor_of_row(const softmax_partial<A>& s) noexcept {
  return {s.max, std::log(s.sum)};
}

//! The chosen token's gradient computed without the cancellation of g (1 - p) when p -> 1:
//! (g_lp (-expm1(lp)) - g_ent p (lp + H)) / tau, with lp = log p_y (from the row's anchor).
template <class A>
[[nodiscard]] ULORL_HD A label_gradient(A log_p, A g_log_prob, A g_entropy, A entropy, A inv_tau) noexcept {
  const A p = std::exp(log_p);
  const A ent_term = p == A(0) ? A(0) : g_entropy * p * (log_p + entropy);
  return (g_log_prob * -std::expm1(log_p) - ent_term) * inv_tau;
}

ULORL_NAMESPACE_END
