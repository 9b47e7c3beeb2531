// ulorl/loss/detail/token_loss.hpp — one token's fused loss, lane-wise: the importance ratio, the
// objective descriptor's token function, the rollout-correction weight and the KL term with its
// gradient. The scalar API (policy_token_loss), the strided rows, the SIMD row kernels and device
// code all evaluate this one function.
#pragma once

#include <type_traits>

#include "ulorl/core/config.hpp"
#include "ulorl/core/simd.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/objectives.hpp"
#include "ulorl/loss/policy_loss_types.hpp"
#include "ulorl/loss/ratio.hpp"

ULORL_NAMESPACE_BEGIN

//! The estimator argument of the token loss when the KL term is off (kl_coef = 0).
struct no_kl {};

//! The estimator argument for estimator E weighted by the token's ratio (kl_config::importance_weighted).
template <class E>
struct importance_weighted {
  using estimator = E;
};
template <class E>
inline constexpr bool is_importance_weighted = false;
template <class E>
inline constexpr bool is_importance_weighted<importance_weighted<E>> = true;

namespace detail {
//! The descriptor has a plain form (a cheaper descriptor for a subset of its configurations).
template <class D, class = void>
inline constexpr bool has_plain_form = false;
template <class D>
inline constexpr bool has_plain_form<D, std::void_t<typename D::plain_form>> = true;

inline namespace ULORL_ISA {

//! One token's loss before the aggregation weight, lane-wise.
template <class L>
struct token_lanes {
  typename L::V pg;     //!< weight * objective
  typename L::V kl;     //!< KL estimate (times the ratio when importance-weighted)
  typename L::V dlogp;  //!< d (pg + kl_coef kl) / d logp
  ratio_lanes<L> ratio;
  clip_flags<L> flags;
};

//! `Obj`: a token-level objective descriptor; `Est`: a KL estimator descriptor, importance_weighted<E>
//! (the KL times the ratio, its gradient through both) or no_kl. `Weighted` false: weight 1,
//! whatever `wt` holds (the kernels without rollout weights); true: `wt` multiplies the objective.
//! The objective's parameters `op` have `bound`, the token log-ratio clamp.
template <class Obj, class Est, bool Weighted, class L, class P>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr token_lanes<L> token_loss_lanes(
    typename L::V lp, typename L::V old, typename L::V ref, typename L::V adv, typename L::V wt,
    const token_loss_params<typename L::value_type, P>& p) noexcept {
  using V = typename L::V;
  token_lanes<L> t;
  t.ratio = importance_ratio<L>(lp, old, p.objective.bound);
  const objective_lanes<L> o = Obj::template token<L>(token_args<L>{lp, adv, t.ratio}, p.objective);
  t.flags = o.flags;
  if constexpr (Weighted) {
    t.pg = wt * o.loss;
    t.dlogp = wt * o.dloss;
  } else {
    (void)wt;
    t.pg = o.loss;
    t.dlogp = o.dloss;
  }
  if constexpr (std::is_same_v<Est, no_kl>) {
    (void)ref;
    t.kl = V{};
  } else if constexpr (is_importance_weighted<Est>) {
    const kl_lanes_value<L> k = kl_lanes<typename Est::estimator, L>(lp, ref, p.kl);
    const V r = t.ratio.ratio;
    t.kl = k.value * r;
    t.dlogp += p.kl_coef * (k.grad * r + k.value * t.ratio.dratio);
  } else {
    const kl_lanes_value<L> k = kl_lanes<Est, L>(lp, ref, p.kl);
    t.kl = k.value;
    t.dlogp += p.kl_coef * k.grad;
  }
  return t;
}

//! Calls f(objective descriptor, estimator descriptor or no_kl) for a validated token-level
//! configuration: the plain form of ppo_clip where it applies, the estimator (importance-weighted
//! when configured) when kl_coef != 0.
template <class F>
decltype(auto) visit_token_loss(std::string_view fn, const policy_loss_config& cfg, F&& f) {
  return visit_objective(fn, cfg.objective, [&](const auto& obj) -> decltype(auto) {
    using D = detail::remove_cvref_t<decltype(obj)>;
    auto with_kl = [&](const auto& o) -> decltype(auto) {
      if (cfg.kl_coef == 0.0) return f(o, no_kl{});
      return visit_kl_estimator(fn, cfg.kl, [&](const auto& e) -> decltype(auto) {
        if (cfg.kl.importance_weighted) return f(o, importance_weighted<detail::remove_cvref_t<decltype(e)>>{});
        return f(o, e);
      });
    };
    if constexpr (D::level == objective_level::sequence) {
      return f(obj, no_kl{});  // sequence-level objectives have their own rows (the caller branches on level)
    } else if constexpr (has_plain_form<D>) {
      if (obj.has_plain_form()) {
        typename D::plain_form plain;
        plain.config = obj.config;
        return with_kl(plain);
      }
      return with_kl(obj);
    } else {
      return with_kl(obj);
    }
  });
}

}  // namespace ULORL_ISA
}  // namespace detail
ULORL_NAMESPACE_END
