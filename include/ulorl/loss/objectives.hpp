// ulorl/loss/objectives.hpp — per-token policy objectives: value, d loss / d logp and clip flags.
//
//   ppo_clip   L = max(-A r', -A clamp(r, 1-eps_low, 1+eps_high))            PPO (Schulman 2017);
//              eps_high > eps_low is clip-higher (DAPO 0.2/0.28, ProRL 0.2/0.4);
//              r' = min(r, delta) with `delta` set: TRL / INTELLECT-2 two-sided clip;
//              dual clip (Ye et al. 2020, c > 1): for A < 0, L = min(L, -A c)
//   gspo       the same clipped surrogate on the sequence ratio exp(mean_t log r) (Zheng et al. 2025),
//              clamped from above (verl: 10); the gradient either reaches only the own token (verl,
//              "GSPO-token") or flows through the mean into every token (OpenRLHF, TRL)
//   cispo      L = -sg(clamp(r, 1-eps_low, 1+eps_high)) A logp (MiniMax-M1)
//   gmpo       L_b = -mean_t(A) exp(mean_t y), y the sign-aware clipped log-ratio (Zhao et al. 2025)
//   sapo       L = -sigmoid(tau (r - 1)) (4 / tau) A (verl's soft adaptive policy optimisation)
//   policy_gradient  L = -A logp (REINFORCE / GPG; the gradient of PPO at ratio 1, which is what
//              UloRL's pseudo on-policy importance sampling gives)
//
// Gradients follow torch's autograd on the frameworks' code: a clamp passes the gradient on its
// closed interval, max/min pass it to the selected operand and split it in half at an exact tie.
// The token functions are ULORL_HD scalar math shared by the CPU loops, the fused-from-logits path
// and the CUDA kernels. docs/losses.md has every formula beside the frameworks'.
#pragma once

#include <cmath>
#include <limits>
#include <string_view>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/numerics.hpp"
#include "ulorl/loss/ratio.hpp"

ULORL_NAMESPACE_BEGIN

enum class objective_kind { ppo_clip, gspo, cispo, gmpo, sapo, policy_gradient };

//! Where the gradient of a sequence-level ratio goes (gspo).
enum class sequence_gradient {
  own_token,     //!< verl: log r_b = logp_t - sg(logp_t) + sg(mean): d/d logp_t = 1 for the token itself
  through_mean,  //!< OpenRLHF / TRL: d/d logp_t = 1/n_b for every valid token of the row
};

inline constexpr double no_limit = std::numeric_limits<double>::infinity();

//! Objective parameters. Defaults: symmetric PPO clip 0.2, log-ratio clamp +-20 before exp.
struct objective_config {
  objective_kind kind = objective_kind::ppo_clip;
  double eps_low = 0.2;              //!< ratio clipped below at 1 - eps_low (0 <= eps_low < 1)
  double eps_high = 0.2;             //!< ratio clipped above at 1 + eps_high (>= 0); > eps_low: clip-higher
  double dual_clip = 0.0;            //!< 0: off; else c > 1 bounds the loss of negative advantages by -A c
  double delta = 0.0;                //!< 0: off; else > 1: ratio capped at delta before the min (TRL)
  double log_ratio_clamp = 20.0;     //!< |logp - old| clamped before exp (token ratios); no_limit: none
  double seq_log_ratio_max = 10.0;   //!< gspo: sequence log-ratio clamped from above; no_limit: none
  sequence_gradient seq_gradient = sequence_gradient::own_token;
  double tau_pos = 1.0;              //!< sapo temperature for A > 0
  double tau_neg = 1.05;             //!< sapo temperature for A <= 0
};

//! Throws ulorl::error for an invalid objective configuration.
inline void validate_objective(std::string_view fn, const objective_config& c) {
  require_known(fn, "kind", c.kind, objective_kind::ppo_clip, objective_kind::gspo, objective_kind::cispo,
                objective_kind::gmpo, objective_kind::sapo, objective_kind::policy_gradient);
  require_known(fn, "seq_gradient", c.seq_gradient, sequence_gradient::own_token, sequence_gradient::through_mean);
  if (!(c.eps_low >= 0.0 && c.eps_low < 1.0)) detail::fail_value(fn, "eps_low", c.eps_low, "must be in [0, 1)");
  require_non_negative(fn, "eps_high", c.eps_high);
  if (!(c.dual_clip == 0.0 || (c.dual_clip > 1.0 && std::isfinite(c.dual_clip))))
    detail::fail_value(fn, "dual_clip", c.dual_clip, "must be 0 (off) or a finite c > 1");
  if (!(c.delta == 0.0 || (c.delta > 1.0 && std::isfinite(c.delta))))
    detail::fail_value(fn, "delta", c.delta, "must be 0 (off) or a finite delta > 1");
  if (!(c.log_ratio_clamp > 0.0)) detail::fail_value(fn, "log_ratio_clamp", c.log_ratio_clamp, "must be > 0");
  if (std::isnan(c.seq_log_ratio_max)) detail::fail_value(fn, "seq_log_ratio_max", c.seq_log_ratio_max, "must not be NaN");
  if (c.kind == objective_kind::sapo) {
    require_positive(fn, "tau_pos", c.tau_pos);
    require_positive(fn, "tau_neg", c.tau_neg);
  }
}

//! The configuration converted once to the element type for the inner loops.
template <class T>
struct objective_params {
  objective_kind kind;
  T lo;         //!< 1 - eps_low
  T hi;         //!< 1 + eps_high
  T eps_low;
  T eps_high;
  T dual_c;     //!< +inf when off
  T delta;      //!< +inf when off
  T bound;      //!< token log-ratio clamp (+inf: none)
  T seq_max;    //!< gspo sequence log-ratio upper clamp
  T tau_pos;
  T tau_neg;
  sequence_gradient seq_gradient;
};

template <class T>
[[nodiscard]] constexpr objective_params<T> make_objective_params(const objective_config& c) noexcept {
  constexpr T inf = std::numeric_limits<T>::infinity();
  return {c.kind,
          static_cast<T>(1.0 - c.eps_low),
          static_cast<T>(1.0 + c.eps_high),
          static_cast<T>(c.eps_low),
          static_cast<T>(c.eps_high),
          c.dual_clip > 0.0 ? static_cast<T>(c.dual_clip) : inf,
          c.delta > 0.0 ? static_cast<T>(c.delta) : inf,
          static_cast<T>(c.log_ratio_clamp),
          static_cast<T>(c.seq_log_ratio_max),
          static_cast<T>(c.tau_pos),
          static_cast<T>(c.tau_neg),
          c.seq_gradient};
}

//! Per-token flags reported by the objectives (summed into the metrics).
enum token_flag : unsigned {
  flag_clipped = 1u,       //!< the clipped branch was selected (verl pg_clipfrac, OpenRLHF clip_ratio)
  flag_clipped_low = 2u,   //!< ratio below 1 - eps_low with A < 0 (TRL clip_ratio/low_mean)
  flag_clipped_high = 4u,  //!< ratio above 1 + eps_high with A > 0 (TRL clip_ratio/high_mean)
  flag_dual_clipped = 8u,  //!< dual clip bound selected (verl pg_clipfrac_lower)
};

//! One token's objective: loss value and d loss / d (the variable the caller's `dratio` refers to).
template <class T>
struct objective_value {
  T loss;
  T dloss;
  unsigned flags;
};

//! max(a, b) with torch's gradient: the selected operand's, half of each at a tie.
template <class T>
ULORL_HD ULORL_LOSS_INLINE constexpr void select_max(T a, T da, T b, T db, T& v, T& dv) noexcept {
  // Arithmetic outside the selects: an FP operation inside a conditional arm may trap, which
  // stops the compiler from if-converting (and vectorising) the token loops.
  const T half = T(0.5) * (da + db);
  v = a > b ? a : b;
  dv = a > b ? da : (b > a ? db : half);
}

//! The clipped surrogate (ppo_clip, gspo) given the ratio r and its derivative dr:
//!   L1 = -A min(r, delta), L2 = -A clamp(r, lo, hi), C1 = max(L1, L2), and for A < 0 with dual
//!   clip C2 = min(C1, -A c). Returns the loss and d loss = dL/dr * dr.
//!
//! Without delta and dual clip (the common case: DAPO, ProRL, GRPO) the same values come from
//! `clipped_surrogate_plain`, which the vectorised kernels use: there L1 == L2 implies
//! dL1 == dL2 (either A = 0 or r is inside [lo, hi]), so the tie rule needs no half step, and
//! L2 > L1 only where r is outside [lo, hi], where the clamp passes no gradient: dL2 = 0.
template <class T>
[[nodiscard]] ULORL_HD ULORL_LOSS_INLINE constexpr objective_value<T> clipped_surrogate_plain(T r, T dr, T adv,
                                                                                    const objective_params<T>& p) noexcept {
  const T rc = clamp(r, p.lo, p.hi);
  const T l1 = -adv * r, l2 = -adv * rc;
  const bool clipped = l2 > l1;
  const unsigned flags = (clipped ? flag_clipped : 0u) | (((r < p.lo) & (adv < T(0))) ? flag_clipped_low : 0u) |
                         (((r > p.hi) & (adv > T(0))) ? flag_clipped_high : 0u);
  return {l1 > l2 ? l1 : l2, clipped ? T(0) : -adv * dr, flags};
}

template <class T>
[[nodiscard]] ULORL_HD ULORL_LOSS_INLINE constexpr objective_value<T> clipped_surrogate(T r, T dr, T adv, const objective_params<T>& p) noexcept {
  constexpr T inf = std::numeric_limits<T>::infinity();
  if (p.delta == inf && p.dual_c == inf) return clipped_surrogate_plain(r, dr, adv, p);
  // Two-sided delta clip: one-sided clamp from above, half gradient at the tie.
  const T r1 = r > p.delta ? p.delta : r;
  const T half_dr = T(0.5) * dr;
  const T dr1 = r > p.delta ? T(0) : (r == p.delta ? half_dr : dr);
  const T rc = clamp(r, p.lo, p.hi);
  const T drc = passes(r, p.lo, p.hi) ? dr : T(0);
  const T l1 = -adv * r1, l2 = -adv * rc;
  T c1, dc1;
  select_max(l1, -adv * dr1, l2, -adv * drc, c1, dc1);
  // Dual clip, branch-free: with c = +inf (off) the bound -A c never binds for A < 0.
  const bool neg = adv < T(0);
  const T l3_any = -adv * p.dual_c;  // NaN for A = 0 with c = inf: never selected below
  const T l3 = neg ? l3_any : std::numeric_limits<T>::infinity();  // constant: zero derivative
  const bool dual = neg & (c1 > l3);
  const T half_dc1 = T(0.5) * dc1;
  const T loss = c1 < l3 ? c1 : l3;
  const T dloss = c1 < l3 ? dc1 : (l3 < c1 ? T(0) : half_dc1);
  const unsigned flags = (l2 > l1 ? flag_clipped : 0u) | (((r1 < p.lo) & neg) ? flag_clipped_low : 0u) |
                         (((r1 > p.hi) & (adv > T(0))) ? flag_clipped_high : 0u) | (dual ? flag_dual_clipped : 0u);
  return {loss, dloss, flags};
}

//! CISPO: L = -sg(clamp(r, lo, hi)) A logp; d L / d logp = -clamp(r, lo, hi) A.
template <class T>
[[nodiscard]] ULORL_HD ULORL_LOSS_INLINE constexpr objective_value<T> cispo(T logp, T r, T adv, const objective_params<T>& p) noexcept {
  const T rc = clamp(r, p.lo, p.hi);
  const unsigned flags = (rc != r ? flag_clipped : 0u) | (r < p.lo ? flag_clipped_low : 0u) | (r > p.hi ? flag_clipped_high : 0u);
  return {-rc * adv * logp, -rc * adv, flags};
}

//! SAPO: L = -sigmoid(tau (r - 1)) (4 / tau) A with tau = tau_pos (A > 0) or tau_neg.
template <class T>
[[nodiscard]] ULORL_HD ULORL_LOSS_INLINE constexpr objective_value<T> sapo(T r, T dr, T adv, const objective_params<T>& p) noexcept {
  const T tau = adv > T(0) ? p.tau_pos : p.tau_neg;
  const T s = T(1) / (T(1) + loss_exp(-tau * (r - T(1))));
  return {-s * (T(4) / tau) * adv, -T(4) * adv * s * (T(1) - s) * dr, 0u};
}

//! Plain policy gradient: L = -A logp, d L / d logp = -A.
template <class T>
[[nodiscard]] ULORL_HD ULORL_LOSS_INLINE constexpr objective_value<T> policy_gradient(T logp, T adv) noexcept {
  return {-adv * logp, -adv, 0u};
}

//! GMPO's per-token clipped log-ratio y = sign(A) min(sign(A) x, sign(A) clamp(x, -eps_low, eps_high))
//! and dy/dx (loss = -mean(A) exp(mean y) is formed per row by the caller).
template <class T>
struct gmpo_token {
  T y;
  T dy;
  unsigned flags;
};
template <class T>
[[nodiscard]] ULORL_HD ULORL_LOSS_INLINE constexpr gmpo_token<T> gmpo_log_ratio(T x, T adv, const objective_params<T>& p) noexcept {
  const T xc = clamp(x, -p.eps_low, p.eps_high);
  const T dxc = passes(x, -p.eps_low, p.eps_high) ? T(1) : T(0);
  const T s = adv > T(0) ? T(1) : (adv < T(0) ? T(-1) : T(0));
  // min(s x, s xc): derivative s (or s dxc), split at a tie; times the outer s.
  const T a = s * x, b = s * xc;
  const T y = s * (a < b ? a : b);
  const T dy = s * (a < b ? s : (b < a ? s * dxc : T(0.5) * (s + s * dxc)));
  const bool clipped = x != xc;
  const unsigned flags = clipped ? (flag_clipped | (adv > T(0) ? flag_clipped_high : 0u) | (adv < T(0) ? flag_clipped_low : 0u)) : 0u;
  return {y, dy, flags};
}

ULORL_NAMESPACE_END
