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
//   sequence_cispo, sequence_sapo  cispo and sapo on the sequence ratio exp(mean_t log r) (TRL's
//              importance_sampling_level "sequence")
//   policy_gradient  L = -A logp (REINFORCE / GPG; the gradient of PPO at ratio 1, which is what
//              UloRL's pseudo on-policy importance sampling gives)
//   penalized_pg  L = -A g + c_abs |x| + c_sq x^2 / 2 with g = r or logp, x = logp - old (verl kl_cov:
//              g = r, c_abs on the selected tokens; verl dro: g = logp, c_sq = beta)
//
// Gradients follow torch's autograd on the frameworks' code: a clamp passes the gradient on its
// closed interval, max/min pass it to the selected operand and split it in half at an exact tie.
// Each objective is written once, as a function template over a lane type (core/simd.hpp): the
// scalar loops, the SIMD row kernels and device code evaluate the same source. Each is described by
// one descriptor type (its kind, name, level, parameters, validation and token function) listed in
// `objective_registry`; dispatch from a run-time objective_kind goes through that list and nothing
// else, and an unknown kind is an error. docs/losses.md has every formula beside the frameworks',
// and says how to add an objective.
#pragma once

#include <array>
#include <cmath>
#include <limits>
#include <string_view>
#include <type_traits>
#include <utility>

#include "ulorl/core/config.hpp"
#include "ulorl/core/dispatch.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/numerics.hpp"
#include "ulorl/core/simd.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/ratio.hpp"

ULORL_NAMESPACE_BEGIN

enum class objective_kind {
  ppo_clip,
  gspo,
  cispo,
  gmpo,
  sapo,
  policy_gradient,
  penalized_pg,
  sequence_cispo,
  sequence_sapo
};

//! Where the gradient of a sequence-level ratio goes (gspo).
enum class sequence_gradient {
  own_token,     //!< verl: log r_b = logp_t - sg(logp_t) + sg(mean): d/d logp_t = 1 for the token itself
  through_mean,  //!< OpenRLHF / TRL: d/d logp_t = 1/n_b for every valid token of the row
};

inline constexpr double no_limit = std::numeric_limits<double>::infinity();

//! The surrogate g of penalized_pg.
enum class pg_surrogate {
  ratio,     //!< g = r, the importance ratio (d g / d logp = d r / d logp)
  log_prob,  //!< g = logp (REINFORCE; d g / d logp = 1)
};

// ---- parameters -----------------------------------------------------------------------------------
//
// An objective's own parameters are one struct beside it, with their defaults, their field table
// (visit_fields, as core/fields.hpp reads it: the names the operators, Python and errors use), their checks and their form
// in the kernels' element type T (`in<T>`, made once per call). objective_config holds the kind,
// the parameters every ratio objective shares (the clip range and the log-ratio clamp) and one
// member per objective that has parameters of its own.

namespace detail {
//! S is T or const T: the records a field table visits (C++17, for the device compilers).
template <class S, class T>
inline constexpr bool is_record_v = std::is_same_v<std::remove_const_t<S>, T>;
}  // namespace detail

//! gspo's own parameters: the sequence log-ratio's upper clamp and where its gradient goes.
struct gspo_parameters {
  double seq_log_ratio_max = 10.0;  //!< sequence log-ratio clamped from above (verl: 10); no_limit: none
  sequence_gradient seq_gradient = sequence_gradient::own_token;

  template <class T>
  struct in {
    T seq_max;
    sequence_gradient seq_gradient;
  };
  template <class T>
  [[nodiscard]] constexpr in<T> to() const noexcept {
    return {static_cast<T>(seq_log_ratio_max), seq_gradient};
  }
  void validate(std::string_view fn) const {
    require_known(fn, "seq_gradient", seq_gradient, sequence_gradient::own_token, sequence_gradient::through_mean);
    if (std::isnan(seq_log_ratio_max))
      detail::fail_value(fn, "seq_log_ratio_max", seq_log_ratio_max, "must not be NaN");
  }
};
template <class C, class F, std::enable_if_t<detail::is_record_v<C, gspo_parameters>, int> = 0>
constexpr void visit_fields(C& c, F&& f) {
  f("seq_log_ratio_max", c.seq_log_ratio_max), f("seq_gradient", c.seq_gradient);
}

//! sapo's own parameters: the sigmoid's temperatures for positive and other advantages (verl).
struct sapo_parameters {
  double tau_pos = 1.0;   //!< temperature for A > 0
  double tau_neg = 1.05;  //!< temperature for A <= 0

  template <class T>
  struct in {
    T tau_pos, tau_neg;
  };
  template <class T>
  [[nodiscard]] constexpr in<T> to() const noexcept {
    return {static_cast<T>(tau_pos), static_cast<T>(tau_neg)};
  }
  void validate(std::string_view fn) const {
    require_divisor(fn, "tau_pos", tau_pos);
    require_divisor(fn, "tau_neg", tau_neg);
  }
};
template <class C, class F, std::enable_if_t<detail::is_record_v<C, sapo_parameters>, int> = 0>
constexpr void visit_fields(C& c, F&& f) {
  f("tau_pos", c.tau_pos), f("tau_neg", c.tau_neg);
}

//! penalized_pg's own parameters: the surrogate g and the penalties' coefficients.
struct penalized_pg_parameters {
  pg_surrogate surrogate = pg_surrogate::ratio;
  double abs_penalty = 0.0;     //!< c_abs of c_abs |x| (>= 0)
  double square_penalty = 0.0;  //!< c_sq of c_sq x^2 / 2 (>= 0)

  template <class T>
  struct in {
    T abs_penalty, square_penalty;
    pg_surrogate surrogate;
  };
  template <class T>
  [[nodiscard]] constexpr in<T> to() const noexcept {
    return {static_cast<T>(abs_penalty), static_cast<T>(square_penalty), surrogate};
  }
  void validate(std::string_view fn) const {
    require_known(fn, "surrogate", surrogate, pg_surrogate::ratio, pg_surrogate::log_prob);
    if (!(abs_penalty >= 0.0 && std::isfinite(abs_penalty)))
      detail::fail_value(fn, "abs_penalty", abs_penalty, "must be finite and >= 0");
    if (!(square_penalty >= 0.0 && std::isfinite(square_penalty)))
      detail::fail_value(fn, "square_penalty", square_penalty, "must be finite and >= 0");
  }
};
template <class C, class F, std::enable_if_t<detail::is_record_v<C, penalized_pg_parameters>, int> = 0>
constexpr void visit_fields(C& c, F&& f) {
  f("surrogate", c.surrogate), f("abs_penalty", c.abs_penalty), f("square_penalty", c.square_penalty);
}

//! The objective: its kind, the shared ratio parameters, and each objective's own. Defaults:
//! symmetric PPO clip 0.2, log-ratio clamp +-20 before exp.
struct objective_config {
  objective_kind kind = objective_kind::ppo_clip;
  double eps_low = 0.2;           //!< ratio clipped below at 1 - eps_low (0 <= eps_low < 1)
  double eps_high = 0.2;          //!< ratio clipped above at 1 + eps_high (>= 0); > eps_low: clip-higher
  double dual_clip = 0.0;         //!< 0: off; else c > 1 bounds the loss of negative advantages by -A c
  double delta = 0.0;             //!< 0: off; else > 1: ratio capped at delta before the min (TRL)
  double log_ratio_clamp = 20.0;  //!< |logp - old| clamped before exp (token ratios); no_limit: none
  gspo_parameters gspo{};
  sapo_parameters sapo{};
  penalized_pg_parameters penalized_pg{};
};

//! f(name, field&) for every field of an objective configuration: the shared ones, then each
//! objective's own table (the names are flat: an objective's parameter names are unique).
template <class C, class F, std::enable_if_t<detail::is_record_v<C, objective_config>, int> = 0>
constexpr void visit_fields(C& c, F&& f) {
  f("objective", c.kind), f("eps_low", c.eps_low), f("eps_high", c.eps_high), f("dual_clip", c.dual_clip);
  f("delta", c.delta), f("log_ratio_clamp", c.log_ratio_clamp);
  visit_fields(c.gspo, f), visit_fields(c.sapo, f), visit_fields(c.penalized_pg, f);
}

//! The configuration converted once to the element type for the inner loops: the shared
//! parameters, then each objective's own (its `in<T>`).
template <class T>
struct objective_params {
  objective_kind kind;
  T lo;  //!< 1 - eps_low
  T hi;  //!< 1 + eps_high
  T eps_low;
  T eps_high;
  T dual_c;  //!< +inf when off
  T delta;   //!< +inf when off
  T bound;   //!< token log-ratio clamp (+inf: none)
  gspo_parameters::in<T> gspo;
  sapo_parameters::in<T> sapo;
  penalized_pg_parameters::in<T> penalized_pg;
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
          c.gspo.template to<T>(),
          c.sapo.template to<T>(),
          c.penalized_pg.template to<T>()};
}

//! Per-token flags reported by the objectives (summed into the metrics).
enum token_flag : unsigned {
  flag_clipped = 1u,       //!< the clipped branch was selected (verl pg_clipfrac, OpenRLHF clip_ratio)
  flag_clipped_low = 2u,   //!< ratio below 1 - eps_low with A < 0 (TRL clip_ratio/low_mean)
  flag_clipped_high = 4u,  //!< ratio above 1 + eps_high with A > 0 (TRL clip_ratio/high_mean)
  flag_dual_clipped = 8u,  //!< dual clip bound selected (verl pg_clipfrac_lower)
};

//! The token flags lane-wise: one mask per flag (value-initialised: none set).
template <class L>
struct clip_flags {
  typename L::M clipped{}, low{}, high{}, dual{};
};
//! The flags of one scalar lane as token_flag bits.
template <class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr unsigned flag_bits(
    const clip_flags<simd::scalar_lanes<T>>& f) noexcept {
  return (f.clipped ? flag_clipped : 0u) | (f.low ? flag_clipped_low : 0u) | (f.high ? flag_clipped_high : 0u) |
         (f.dual ? flag_dual_clipped : 0u);
}

//! One token's objective, lane-wise: loss value, d loss / d logp, clip flags.
template <class L>
struct objective_lanes {
  typename L::V loss, dloss;
  clip_flags<L> flags;
};

//! One token's objective (scalar): loss value and d loss / d (the variable the caller's `dratio`
//! refers to), flags as token_flag bits.
template <class T>
struct objective_value {
  T loss;
  T dloss;
  unsigned flags;
};
template <class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr objective_value<T> to_scalar(
    const objective_lanes<simd::scalar_lanes<T>>& o) noexcept {
  return {o.loss, o.dloss, flag_bits(o.flags)};
}

//! What a token objective reads: the token's log-prob, advantage and importance ratio.
template <class L>
struct token_args {
  typename L::V logp;
  typename L::V adv;
  ratio_lanes<L> ratio;
};

// ---- the formulas ---------------------------------------------------------------------------------

//! The clipped surrogate (ppo_clip, and gspo on the sequence ratio) given the ratio r and its
//! derivative dr: L1 = -A min(r, delta), L2 = -A clamp(r, lo, hi), C1 = max(L1, L2), and for A < 0
//! with dual clip C2 = min(C1, -A c). Returns the loss and d loss = dL/dr * dr. max/min pass the
//! gradient to the selected operand and half of each at a tie (torch); a clamp passes it on its
//! closed interval.
template <class L>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr objective_lanes<L> clipped_surrogate_lanes(
    typename L::V r, typename L::V dr, typename L::V adv, const objective_params<typename L::value_type>& p) noexcept {
  using T = typename L::value_type;
  using V = typename L::V;
  using M = typename L::M;
  const V zero = L::splat(T(0));
  const V lo = L::splat(p.lo), hi = L::splat(p.hi), delta = L::splat(p.delta);
  // Two-sided delta clip: one-sided clamp from above, half gradient at the tie.
  const V r1 = L::select(r > delta, delta, r);
  const V half_dr = T(0.5) * dr;
  const V dr1 = L::select(r > delta, zero, L::select(r == delta, half_dr, dr));
  const V rc = L::clamp(r, lo, hi);
  const V drc = L::select(L::passes(r, lo, hi), dr, zero);
  const V l1 = -adv * r1, l2 = -adv * rc;
  const V d1 = -adv * dr1, d2 = -adv * drc;
  // Arithmetic outside the selects: an FP operation inside a conditional arm may trap, which stops
  // the compiler from if-converting (and vectorising) the loops.
  const V half = T(0.5) * (d1 + d2);
  const V c1 = L::select(l1 > l2, l1, l2);
  const V dc1 = L::select(l1 > l2, d1, L::select(l2 > l1, d2, half));
  // Dual clip, branch-free: with c = +inf (off) the bound -A c never binds for A < 0.
  const M neg = adv < T(0);
  const V l3_any = -adv * p.dual_c;  // NaN for A = 0 with c = inf: never selected below
  const V l3 = L::select(neg, l3_any, L::splat(std::numeric_limits<T>::infinity()));  // constant: zero derivative
  const V half_dc1 = T(0.5) * dc1;
  objective_lanes<L> o;
  o.loss = L::select(c1 < l3, c1, l3);
  o.dloss = L::select(c1 < l3, dc1, L::select(l3 < c1, zero, half_dc1));
  o.flags.clipped = l2 > l1;
  o.flags.low = (r1 < lo) & neg;
  o.flags.high = (r1 > hi) & (adv > T(0));
  o.flags.dual = neg & (c1 > l3);
  return o;
}

//! The clipped surrogate without delta and dual clip (the common case: DAPO, ProRL, GRPO): the same
//! values as clipped_surrogate_lanes in fewer operations. L1 == L2 implies dL1 == dL2 (A = 0 or r
//! inside [lo, hi]), so the tie rule needs no half step, and L2 > L1 only outside [lo, hi], where
//! the clamp passes no gradient.
template <class L>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr objective_lanes<L> clipped_surrogate_plain_lanes(
    typename L::V r, typename L::V dr, typename L::V adv, const objective_params<typename L::value_type>& p) noexcept {
  using T = typename L::value_type;
  using V = typename L::V;
  const V lo = L::splat(p.lo), hi = L::splat(p.hi);
  const V rc = L::clamp(r, lo, hi);
  const V l1 = -adv * r, l2 = -adv * rc;
  objective_lanes<L> o;
  o.flags.clipped = l2 > l1;
  o.loss = L::select(l1 > l2, l1, l2);
  o.dloss = L::select(o.flags.clipped, L::splat(T(0)), -adv * dr);
  o.flags.low = (r < lo) & (adv < T(0));
  o.flags.high = (r > hi) & (adv > T(0));
  return o;
}

//! GMPO's per-token clipped log-ratio y = sign(A) min(sign(A) x, sign(A) clamp(x, -eps_low,
//! eps_high)) and dy/dx; the row loss -mean(A) exp(mean y) is formed by the sequence rows.
template <class L>
struct gmpo_token_lanes {
  typename L::V y, dy;
  clip_flags<L> flags;
};
template <class L>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr gmpo_token_lanes<L> gmpo_log_ratio_lanes(
    typename L::V x, typename L::V adv, const objective_params<typename L::value_type>& p) noexcept {
  using T = typename L::value_type;
  using V = typename L::V;
  const V zero = L::splat(T(0)), one = L::splat(T(1));
  const V elo = L::splat(-p.eps_low), ehi = L::splat(p.eps_high);
  const V xc = L::clamp(x, elo, ehi);
  const V dxc = L::select(L::passes(x, elo, ehi), one, zero);
  const V s = L::select(adv > T(0), one, L::select(adv < T(0), L::splat(T(-1)), zero));
  // min(s x, s xc): derivative s (or s dxc), split at a tie; times the outer s.
  const V a = s * x, b = s * xc;
  const V sdxc = s * dxc;
  const V tie = T(0.5) * (s + sdxc);
  gmpo_token_lanes<L> g;
  g.y = s * L::select(a < b, a, b);
  g.dy = s * L::select(a < b, s, L::select(b < a, sdxc, tie));
  const typename L::M clipped = x != xc;
  g.flags.clipped = clipped;
  g.flags.high = clipped & (adv > T(0));
  g.flags.low = clipped & (adv < T(0));
  return g;
}

// ---- descriptors ----------------------------------------------------------------------------------
//
// A descriptor is a type with
//   static constexpr std::string_view name;          // for messages and metrics
//   static constexpr objective_level level;          // token: one token function; sequence: a row pass
//   template <class T> P<T> params() const;          // the parameters in T, once per call
//   void validate(std::string_view fn) const;        // throws ulorl::error for bad parameters
//   template <class L> static objective_lanes<L> token(const token_args<L>&, const P<T>&);  // token level
// The built-in descriptors hold the objective_config they were made from and have a `kind`; one
// with parameters of its own names their struct (`using parameters = ...`, see "parameters" above),
// which objective_config holds as a member. A descriptor defined outside the library (any
// parameters of its own) runs through policy_loss_with() exactly as the built-in ones run through
// policy_loss().

enum class objective_level { token, sequence };

namespace detail {
//! Checks shared by every built-in objective.
inline void validate_objective_common(std::string_view fn, const objective_config& c) {
  if (!(c.eps_low >= 0.0 && c.eps_low < 1.0)) detail::fail_value(fn, "eps_low", c.eps_low, "must be in [0, 1)");
  require_non_negative(fn, "eps_high", c.eps_high);
  if (!(c.dual_clip == 0.0 || (c.dual_clip > 1.0 && std::isfinite(c.dual_clip))))
    detail::fail_value(fn, "dual_clip", c.dual_clip, "must be 0 (off) or a finite c > 1");
  if (!(c.delta == 0.0 || (c.delta > 1.0 && std::isfinite(c.delta))))
    detail::fail_value(fn, "delta", c.delta, "must be 0 (off) or a finite delta > 1");
  if (!(c.log_ratio_clamp > 0.0)) detail::fail_value(fn, "log_ratio_clamp", c.log_ratio_clamp, "must be > 0");
  c.gspo.validate(fn);
}

//! The part of a built-in descriptor that only depends on objective_config.
template <objective_kind K>
struct builtin_objective {
  static constexpr objective_kind kind = K;
  objective_config config{};
  template <class T>
  [[nodiscard]] objective_params<T> params() const noexcept {
    return make_objective_params<T>(config);
  }
  void validate(std::string_view fn) const { validate_objective_common(fn, config); }
};
}  // namespace detail

//! PPO's clipped surrogate with clip-higher, TRL's two-sided delta and dual clip.
struct ppo_clip_objective : detail::builtin_objective<objective_kind::ppo_clip> {
  static constexpr std::string_view name = "ppo_clip";
  static constexpr objective_level level = objective_level::token;
  template <class L>
  [[nodiscard]] ULORL_HD static ULORL_ALWAYS_INLINE constexpr objective_lanes<L> token(
      const token_args<L>& a, const objective_params<typename L::value_type>& p) noexcept {
    return clipped_surrogate_lanes<L>(a.ratio.ratio, a.ratio.dratio, a.adv, p);
  }
  //! The same objective in fewer operations when delta and dual clip are off.
  struct plain_form;
  template <class T>
  [[nodiscard]] ULORL_HD static constexpr bool plain_applies(const objective_params<T>& p) noexcept {
    return p.delta == std::numeric_limits<T>::infinity() && p.dual_c == std::numeric_limits<T>::infinity();
  }
  [[nodiscard]] bool has_plain_form() const noexcept { return plain_applies(params<double>()); }
};
struct ppo_clip_objective::plain_form : detail::builtin_objective<objective_kind::ppo_clip> {
  static constexpr std::string_view name = "ppo_clip";
  static constexpr objective_level level = objective_level::token;
  template <class L>
  [[nodiscard]] ULORL_HD static ULORL_ALWAYS_INLINE constexpr objective_lanes<L> token(
      const token_args<L>& a, const objective_params<typename L::value_type>& p) noexcept {
    return clipped_surrogate_plain_lanes<L>(a.ratio.ratio, a.ratio.dratio, a.adv, p);
  }
};

//! CISPO (MiniMax-M1): L = -sg(clamp(r, lo, hi)) A logp; d L / d logp = -clamp(r, lo, hi) A.
//! Flags low / high carry the advantage sign as token_flag says (TRL `cispo_clip_ratio` = high).
struct cispo_objective : detail::builtin_objective<objective_kind::cispo> {
  static constexpr std::string_view name = "cispo";
  static constexpr objective_level level = objective_level::token;
  template <class L>
  [[nodiscard]] ULORL_HD static ULORL_ALWAYS_INLINE constexpr objective_lanes<L> token(
      const token_args<L>& a, const objective_params<typename L::value_type>& p) noexcept {
    using V = typename L::V;
    const V r = a.ratio.ratio, lo = L::splat(p.lo), hi = L::splat(p.hi);
    const V rc = L::clamp(r, lo, hi);
    objective_lanes<L> o;
    o.loss = -rc * a.adv * a.logp;
    o.dloss = -rc * a.adv;
    o.flags.clipped = rc != r;
    o.flags.low = (r < lo) & (a.adv < typename L::value_type(0));
    o.flags.high = (r > hi) & (a.adv > typename L::value_type(0));
    return o;
  }
  //! eps_low = 1 is allowed: lo = 0 turns the clamp into TRL's one-sided min(r, 1 + eps_high),
  //! whose cap may then lie below 1 (eps_high in [-1, 0): TRL's epsilon_high < 1).
  void validate(std::string_view fn) const {
    objective_config c = config;
    if (c.eps_low == 1.0) {
      c.eps_low = 0.0;
      if (c.eps_high >= -1.0 && c.eps_high < 0.0) c.eps_high = 0.0;
    }
    detail::validate_objective_common(fn, c);
  }
};

//! SAPO (verl): L = -sigmoid(tau (r - 1)) (4 / tau) A with tau = tau_pos (A > 0) or tau_neg.
struct sapo_objective : detail::builtin_objective<objective_kind::sapo> {
  static constexpr std::string_view name = "sapo";
  static constexpr objective_level level = objective_level::token;
  using parameters = sapo_parameters;
  void validate(std::string_view fn) const {
    detail::validate_objective_common(fn, config);
    config.sapo.validate(fn);
  }
  template <class L>
  [[nodiscard]] ULORL_HD static ULORL_ALWAYS_INLINE constexpr objective_lanes<L> token(
      const token_args<L>& a, const objective_params<typename L::value_type>& p) noexcept {
    using T = typename L::value_type;
    using V = typename L::V;
    using C = detail::exp_constants<T>;
    const V r = a.ratio.ratio, dr = a.ratio.dratio;
    const V tau = L::select(a.adv > T(0), L::splat(p.sapo.tau_pos), L::splat(p.sapo.tau_neg));
    V em1{};
    const V e = L::exp_in_range(L::clamp(-tau * (r - T(1)), L::splat(C::lo), L::splat(C::hi)), em1);
    const V s = T(1) / (T(1) + e);
    objective_lanes<L> o;
    o.loss = -s * (T(4) / tau) * a.adv;
    o.dloss = -T(4) * a.adv * s * (T(1) - s) * dr;
    return o;
  }
};

//! Plain policy gradient (REINFORCE, GPG; what UloRL's pseudo on-policy IS gives): L = -A logp.
struct policy_gradient_objective : detail::builtin_objective<objective_kind::policy_gradient> {
  static constexpr std::string_view name = "policy_gradient";
  static constexpr objective_level level = objective_level::token;
  template <class L>
  [[nodiscard]] ULORL_HD static ULORL_ALWAYS_INLINE constexpr objective_lanes<L> token(
      const token_args<L>& a, const objective_params<typename L::value_type>&) noexcept {
    objective_lanes<L> o;
    o.loss = -a.adv * a.logp;
    o.dloss = -a.adv;
    return o;
  }
};

//! A policy gradient with a log-ratio penalty: L = -A g + c_abs |x| + c_sq x^2 / 2, x = logp - old
//! (unclamped), g = r (surrogate ratio) or logp; d L / d logp = -A g' + c_abs sign(x) + c_sq x
//! (sign(0) = 0). verl `kl_cov` (Cui et al. 2025, KL-Cov): g = r, c_abs = ppo_kl_coef on the
//! selected tokens, 0 elsewhere; verl `dro`: g = logp, c_sq = dro_beta.
struct penalized_pg_objective : detail::builtin_objective<objective_kind::penalized_pg> {
  static constexpr std::string_view name = "penalized_pg";
  static constexpr objective_level level = objective_level::token;
  using parameters = penalized_pg_parameters;
  void validate(std::string_view fn) const {
    detail::validate_objective_common(fn, config);
    config.penalized_pg.validate(fn);
  }
  template <class L>
  [[nodiscard]] ULORL_HD static ULORL_ALWAYS_INLINE constexpr objective_lanes<L> token(
      const token_args<L>& a, const objective_params<typename L::value_type>& p) noexcept {
    using T = typename L::value_type;
    using V = typename L::V;
    const V x = a.ratio.x, zero = L::splat(T(0)), one = L::splat(T(1));
    const auto& pp = p.penalized_pg;
    const typename L::M on_ratio = L::mask_of(pp.surrogate == pg_surrogate::ratio);
    const V g = L::select(on_ratio, a.ratio.ratio, a.logp);
    const V dg = L::select(on_ratio, a.ratio.dratio, one);
    const V ax = L::select(x < T(0), -x, x);
    const V sx = L::select(x > T(0), one, L::select(x < T(0), -one, zero));
    objective_lanes<L> o;
    o.loss = -a.adv * g + pp.abs_penalty * ax + (T(0.5) * pp.square_penalty) * (x * x);
    o.dloss = -a.adv * dg + pp.abs_penalty * sx + pp.square_penalty * x;
    return o;
  }
};

// ---- scalar forms (tests, presets, callers with one token) -----------------------------------------

//! The clipped surrogate of one token (the plain form when delta and dual clip are off).
template <class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr objective_value<T> clipped_surrogate(
    T r, T dr, T adv, const objective_params<T>& p) noexcept {
  if (ppo_clip_objective::plain_applies(p))
    return to_scalar(clipped_surrogate_plain_lanes<simd::scalar_lanes<T>>(r, dr, adv, p));
  return to_scalar(clipped_surrogate_lanes<simd::scalar_lanes<T>>(r, dr, adv, p));
}
template <class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr objective_value<T> clipped_surrogate_plain(
    T r, T dr, T adv, const objective_params<T>& p) noexcept {
  return to_scalar(clipped_surrogate_plain_lanes<simd::scalar_lanes<T>>(r, dr, adv, p));
}
namespace detail {
template <class D, class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr objective_value<T> token_scalar(
    T logp, T r, T dr, T adv, const objective_params<T>& p) noexcept {
  using L = simd::scalar_lanes<T>;
  const token_args<L> a{logp, adv, {T(0), T(0), r, dr, T(0)}};
  return to_scalar(D::template token<L>(a, p));
}
}  // namespace detail
//! CISPO of one token (ratio r); d loss / d logp.
template <class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr objective_value<T> cispo(T logp, T r, T adv,
                                                                              const objective_params<T>& p) noexcept {
  return detail::token_scalar<cispo_objective>(logp, r, T(0), adv, p);
}
//! SAPO of one token (ratio r, d r = dr).
template <class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr objective_value<T> sapo(T r, T dr, T adv,
                                                                             const objective_params<T>& p) noexcept {
  return detail::token_scalar<sapo_objective>(T(0), r, dr, adv, p);
}
//! Plain policy gradient of one token: L = -A logp, d L / d logp = -A.
template <class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr objective_value<T> policy_gradient(T logp, T adv) noexcept {
  return detail::token_scalar<policy_gradient_objective>(logp, T(1), T(0), adv, objective_params<T>{});
}

template <class T>
struct gmpo_token {
  T y;
  T dy;
  unsigned flags;
};
//! GMPO's clipped log-ratio of one token (see gmpo_log_ratio_lanes).
template <class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr gmpo_token<T> gmpo_log_ratio(
    T x, T adv, const objective_params<T>& p) noexcept {
  const auto g = gmpo_log_ratio_lanes<simd::scalar_lanes<T>>(x, adv, p);
  return {g.y, g.dy, flag_bits(g.flags)};
}

// ---- sequence-level objectives --------------------------------------------------------------------
//
// A sequence-level descriptor (level == sequence) adds three steps to the protocol, which one row
// driver runs on the CPU (loss/detail/sequence_rows.hpp) and on the device (kernels/.../policy_loss.cuh):
//   static sequence_sums row_token(T lp, T old, T adv, T w, bool has_w, const P<T>& p);
//       one valid token's part of its row's sums (summed in double, in token order on the CPU, by a
//       fixed tree on the device); w is the rollout weight (1 without weights)
//   static sequence_row_terms<T> row(const sequence_sums& s, double nd, bool has_w,
//                                    const agg_normalizer& norm, const P<T>& p);
//       the row's terms from its sums over nd valid tokens (nd 0: a row without valid tokens)
//   static sequence_token<T> token(T lp, T old, T adv, T w, T ref, bool valid, double wd,
//                                  const sequence_row_terms<T>& row, const token_loss_params<T, P>& p,
//                                  bool has_ref);
//       one token's loss terms, gradient parts, metrics inputs and flags (wd: the row's
//       aggregation weight)

//! A row's sums over its valid tokens (what each objective puts in a, b and c is its own).
struct sequence_sums {
  double a = 0.0, b = 0.0, c = 0.0;
  ULORL_HD ULORL_ALWAYS_INLINE constexpr void add(const sequence_sums& t) noexcept { a += t.a, b += t.b, c += t.c; }
};

//! A row's terms, from its sums.
template <class T>
struct sequence_row_terms {
  T ratio;                     //!< the row's ratio (the surrogate's, and the metrics')
  T dratio;                    //!< its derivative (0 where the token step does not use it)
  double coef = 0.0;           //!< d loss / d (token statistic) for every valid token (gmpo)
  double pg_direct = 0.0;      //!< the row's objective term, when the row carries it (has_direct)
  bool has_direct = false;     //!< the objective is the row's (tokens add 0 to the objective sum)
  bool through_mean = false;   //!< spread the row's gradient sum (to_row_*) over its valid tokens
  bool sequence_clip = false;  //!< report the row's clip flags (seq_clipped_low / _high)
};

//! One token's contribution to its row: the objective and KL terms for the row sums, the ratio and
//! flags for the metrics, and the token's gradient parts.
template <class T>
struct sequence_token {
  T pg;                                      //!< weight * objective (0 where the row carries it)
  T kl;                                      //!< KL estimate (weighted when importance-weighted)
  ratio_lanes<simd::scalar_lanes<T>> ratio;  //!< for fold_token's metrics
  clip_flags<simd::scalar_lanes<T>> flags;   //!< for fold_token's metrics
  double grad;                               //!< d loss / d logp of the token itself (agg weight included)
  //! through_mean: this token's parts of d loss / d (row statistic) (objective, KL weight), which
  //! the row sums in this order
  double to_row_pg, to_row_kl;
};

namespace detail {
//! The KL term of one token of a sequence-level row: the estimate, d kl / d logp through the
//! estimate, and, importance-weighted by `iw` (derivative `diw`), the part through the weight, which
//! the caller routes (to the token itself or spread over the row).
template <class T>
struct sequence_kl {
  T value;  //!< kl (times iw when importance-weighted)
  T grad;   //!< d kl / d logp through the estimate
  T via_w;  //!< kl * d iw / d logp (0 without importance weighting)
};
template <class T, class LP>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr sequence_kl<T> sequence_token_kl(T lp, T ref, T iw, T diw,
                                                                                      const LP& p) noexcept {
  const auto k = kl_term(lp, ref, p.kl);
  if (!p.kl.importance_weighted) return {k.value, k.grad, T(0)};
  return {k.value * iw, k.grad * iw, k.value * diw};
}
//! The row sums of a sequence objective on the row's mean log-ratio: a, the token's log-ratio.
struct log_ratio_row_sums {
  template <class T>
  [[nodiscard]] ULORL_HD static ULORL_ALWAYS_INLINE constexpr sequence_sums row_token(
      T lp, T old, T, T, bool, const objective_params<T>&) noexcept {
    return {static_cast<double>(lp) - static_cast<double>(old), 0.0, 0.0};
  }
};
//! The token flags as clip_flags of one scalar lane.
template <class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr clip_flags<simd::scalar_lanes<T>> scalar_flags(
    unsigned f, bool dual = true) noexcept {
  return {(f & flag_clipped) != 0, (f & flag_clipped_low) != 0, (f & flag_clipped_high) != 0,
          dual && (f & flag_dual_clipped) != 0};
}
}  // namespace detail

//! GSPO (Zheng et al. 2025): the clipped surrogate of every token on the row's ratio
//! exp(min(mean_t x, seq_max)), x = logp - old; its gradient reaches the token itself (verl) or,
//! through_mean, every valid token through the mean log-ratio (OpenRLHF, TRL); the KL term is
//! importance-weighted by the row's ratio (TRL).
struct gspo_objective : detail::builtin_objective<objective_kind::gspo>, detail::log_ratio_row_sums {
  static constexpr std::string_view name = "gspo";
  static constexpr objective_level level = objective_level::sequence;
  using parameters = gspo_parameters;

  template <class T>
  [[nodiscard]] ULORL_HD static ULORL_ALWAYS_INLINE constexpr sequence_row_terms<T> row(
      const sequence_sums& s, double nd, bool, const agg_normalizer&, const objective_params<T>& op) noexcept {
    const T st = static_cast<T>(s.a / (nd > 0 ? nd : 1.0));
    const T seq_max = op.gspo.seq_max;
    const T rho = st > seq_max ? seq_max : st;
    const T r = loss_exp(rho);
    sequence_row_terms<T> t{r, st <= seq_max ? r : T(0)};
    t.through_mean = op.gspo.seq_gradient == sequence_gradient::through_mean;
    t.sequence_clip = true;
    return t;
  }
  template <class T, class LP>
  [[nodiscard]] ULORL_HD static ULORL_ALWAYS_INLINE constexpr sequence_token<T> token(T lp, T old, T adv, T wt, T ref,
                                                                                      bool valid, double wd,
                                                                                      const sequence_row_terms<T>& row,
                                                                                      const LP& p,
                                                                                      bool has_ref) noexcept {
    const auto& op = p.objective;
    const T x = lp - old;
    const auto o = clipped_surrogate(row.ratio, row.dratio, adv, op);
    sequence_token<T> s{};
    T own = T(0);  // d loss / d logp_t through this token's own terms (before the agg weight)
    if (!row.through_mean)
      own += wt * o.dloss;
    else
      s.to_row_pg = valid ? wd * static_cast<double>(wt * o.dloss) : 0.0;
    if (has_ref) {
      const auto k = detail::sequence_token_kl(lp, ref, row.ratio, row.dratio, p);
      s.kl = k.value;
      if (row.through_mean) {
        s.to_row_kl = valid ? wd * static_cast<double>(p.kl_coef * k.via_w) : 0.0;
        own += p.kl_coef * k.grad;
      } else {
        own += p.kl_coef * (k.grad + k.via_w);
      }
    }
    const T xc = clamp(x, -op.bound, op.bound);
    s.ratio = {x, xc, row.ratio, row.dratio, exp_minus_one_minus_x(xc)};
    s.flags = detail::scalar_flags<T>(o.flags);
    s.pg = wt * o.loss;
    s.grad = wd * static_cast<double>(own);
    return s;
  }
};

//! GMPO (Zhao et al. 2025): the row's loss L_b = -mean_t(A) exp(mean_t y) w_b over the normaliser,
//! y the sign-aware clipped log-ratio of each valid token (gmpo_log_ratio) and w_b the geometric
//! mean of the row's rollout weights; every token's gradient goes through mean_t y. The KL term is
//! importance-weighted by the token's own clamped ratio.
struct gmpo_objective : detail::builtin_objective<objective_kind::gmpo> {
  static constexpr std::string_view name = "gmpo";
  static constexpr objective_level level = objective_level::sequence;

  //! A rollout weight's term of the row's log-weight sum (the geometric mean's log).
  [[nodiscard]] ULORL_HD static ULORL_ALWAYS_INLINE double log_weight(double w) noexcept { return std::log(w + 1e-10); }
  //! a: y, b: the advantage, c: the log rollout weight.
  template <class T>
  [[nodiscard]] ULORL_HD static ULORL_ALWAYS_INLINE sequence_sums row_token(T lp, T old, T adv, T w, bool has_w,
                                                                            const objective_params<T>& op) noexcept {
    return {static_cast<double>(gmpo_log_ratio<T>(lp - old, adv, op).y), static_cast<double>(adv),
            has_w ? log_weight(static_cast<double>(w)) : 0.0};
  }
  template <class T>
  [[nodiscard]] ULORL_HD static ULORL_ALWAYS_INLINE sequence_row_terms<T> row(const sequence_sums& s, double nd,
                                                                              bool has_w, const agg_normalizer& norm,
                                                                              const objective_params<T>&) noexcept {
    if (!(nd > 0)) return {T(1), T(0)};
    const double ratio_b = loss_exp(s.a / nd), adv_b = s.b / nd, wb = has_w ? loss_exp(s.c / nd) : 1.0;
    const double lb = -adv_b * ratio_b * wb;
    sequence_row_terms<T> t{static_cast<T>(ratio_b), T(0)};
    t.coef = norm.scale / norm.denominator * lb / nd;
    t.pg_direct = norm.scale / norm.denominator * lb;
    t.has_direct = true;
    return t;
  }
  template <class T, class LP>
  [[nodiscard]] ULORL_HD static ULORL_ALWAYS_INLINE constexpr sequence_token<T> token(T lp, T old, T adv, T, T ref,
                                                                                      bool, double wd,
                                                                                      const sequence_row_terms<T>& row,
                                                                                      const LP& p,
                                                                                      bool has_ref) noexcept {
    const auto& op = p.objective;
    const T x = lp - old;
    const auto gt = gmpo_log_ratio<T>(x, adv, op);
    sequence_token<T> s{};
    T own = T(0);  // d loss / d logp_t through the KL term (before the agg weight)
    if (has_ref) {
      const auto tr = p.kl.importance_weighted ? clamped_ratio(lp, old, op.bound) : ratio_value<T>{T(0), T(1), T(0)};
      const auto k = detail::sequence_token_kl(lp, ref, tr.ratio, tr.dratio, p);
      s.kl = k.value;
      own += p.kl_coef * (k.grad + k.via_w);
    }
    const T xc = clamp(x, -op.bound, op.bound);
    s.ratio = {x, xc, row.ratio, T(0), exp_minus_one_minus_x(xc)};
    s.flags = detail::scalar_flags<T>(gt.flags, false);
    s.pg = T(0);
    s.grad = row.coef * static_cast<double>(gt.dy) + wd * static_cast<double>(own);
    return s;
  }
};

namespace detail {
//! The sequence-level form of a token-level objective D: D's token function on the row's ratio
//! r_b = exp(w_b), w_b = mean_t (logp - old) over the valid tokens (unclamped), as TRL's
//! importance_sampling_level "sequence" computes it. D's gradient through the ratio reaches every
//! valid token through the mean; its gradient through logp (cispo's) reaches the token itself. The
//! KL term is importance-weighted by r_b, its weight's gradient through the mean (TRL). The rollout
//! weight multiplies the objective's term, not the KL term. A new sequence-level form is one
//! descriptor deriving from this with its kind and name.
template <class D, objective_kind K>
struct sequence_form : builtin_objective<K>, log_ratio_row_sums {
  static constexpr objective_level level = objective_level::sequence;
  void validate(std::string_view fn) const {
    D d;
    d.config = this->config;
    d.validate(fn);
  }
  template <class T>
  [[nodiscard]] ULORL_HD static ULORL_ALWAYS_INLINE constexpr sequence_row_terms<T> row(
      const sequence_sums& s, double nd, bool, const agg_normalizer&, const objective_params<T>&) noexcept {
    const T r = loss_exp(static_cast<T>(s.a / (nd > 0 ? nd : 1.0)));
    sequence_row_terms<T> t{r, r};
    t.through_mean = true;
    t.sequence_clip = true;
    return t;
  }
  template <class T, class LP>
  [[nodiscard]] ULORL_HD static ULORL_ALWAYS_INLINE constexpr sequence_token<T> token(T lp, T old, T adv, T wt, T ref,
                                                                                      bool valid, double wd,
                                                                                      const sequence_row_terms<T>& row,
                                                                                      const LP& p,
                                                                                      bool has_ref) noexcept {
    using L = simd::scalar_lanes<T>;
    const auto& op = p.objective;
    const T x = lp - old, xc = clamp(x, -op.bound, op.bound);
    token_args<L> a{lp, adv, {x, xc, row.ratio, row.dratio, exp_minus_one_minus_x(xc)}};
    const objective_lanes<L> whole = D::template token<L>(a, op);  // d / d logp_t, the ratio's part as d / d w_b
    a.ratio.dratio = T(0);
    const T direct = D::template token<L>(a, op).dloss;  // with the ratio held: the part through logp_t
    sequence_token<T> s{};
    T own = wt * direct;
    s.to_row_pg = valid ? wd * static_cast<double>(wt * (whole.dloss - direct)) : 0.0;
    if (has_ref) {
      const auto k = sequence_token_kl(lp, ref, row.ratio, row.dratio, p);
      s.kl = k.value;
      s.to_row_kl = valid ? wd * static_cast<double>(p.kl_coef * k.via_w) : 0.0;
      own += p.kl_coef * k.grad;
    }
    s.ratio = a.ratio;
    s.ratio.dratio = row.dratio;
    s.flags = whole.flags;
    s.pg = wt * whole.loss;
    s.grad = wd * static_cast<double>(own);
    return s;
  }
};
}  // namespace detail

//! CISPO on the sequence ratio (TRL's sequence-level cispo): -sg(clamp(r_b, lo, hi)) A logp.
struct sequence_cispo_objective : detail::sequence_form<cispo_objective, objective_kind::sequence_cispo> {
  static constexpr std::string_view name = "sequence_cispo";
};

//! SAPO on the sequence ratio (TRL's sequence-level sapo): -sigmoid(tau (r_b - 1)) (4 / tau) A.
struct sequence_sapo_objective : detail::sequence_form<sapo_objective, objective_kind::sequence_sapo> {
  static constexpr std::string_view name = "sequence_sapo";
  using parameters = sapo_parameters;
};

//! Every built-in objective: the only list run-time dispatch consults.
using objective_registry = descriptor_list<ppo_clip_objective, gspo_objective, cispo_objective, gmpo_objective,
                                           sapo_objective, policy_gradient_objective, penalized_pg_objective,
                                           sequence_cispo_objective, sequence_sapo_objective>;

//! The objectives' names ({name, kind}, from the registry's descriptors).
inline constexpr auto objective_names = name_table(objective_registry{});
//! The names of sequence_gradient and pg_surrogate.
inline constexpr std::array<std::pair<std::string_view, sequence_gradient>, 2> sequence_gradient_names{
    {{"own_token", sequence_gradient::own_token}, {"through_mean", sequence_gradient::through_mean}}};
inline constexpr std::array<std::pair<std::string_view, pg_surrogate>, 2> pg_surrogate_names{
    {{"ratio", pg_surrogate::ratio}, {"log_prob", pg_surrogate::log_prob}}};

//! Calls f(descriptor) with the built-in descriptor of c.kind (holding c); an unknown kind throws
//! ulorl::error naming `fn` and the argument "kind".
template <class F>
decltype(auto) visit_objective(std::string_view fn, const objective_config& c, F&& f) {
  return detail::visit_kind(fn, "kind", c.kind, c, f, objective_registry{});
}

//! Throws ulorl::error for an invalid objective configuration (an unknown kind included).
inline void validate_objective(std::string_view fn, const objective_config& c) {
  visit_objective(fn, c, [&](const auto& d) { d.validate(fn); });
}

ULORL_NAMESPACE_END
