// Tests of the extension point of ulorl/loss/policy_loss.hpp (policy_loss_with, policy_token_loss_with):
// an objective and a KL estimator defined here, outside the library, through the public descriptor
// interface of objectives.hpp and kl.hpp, run through the scalar per-token path, the strided loop
// and the SIMD row kernel, against a float64 oracle written from their formulas and a central
// finite difference. Also: an unknown objective kind or estimator is rejected before anything is
// written.
#include <ulorl/loss/policy_loss.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "catch.hpp"

namespace {

// ---- the objective: L = -A r^alpha (r the clamped ratio); flags "clipped" where r > cap ---------

template <class T>
struct power_params {
  T bound;  //!< the token log-ratio clamp (required by the kernels)
  T alpha;
  T cap;
};

struct power_ratio_objective {
  [[maybe_unused]] static constexpr std::string_view name = "power_ratio";  // the protocol's; read by no call here
  static constexpr ulorl::objective_level level = ulorl::objective_level::token;
  double alpha = 0.5;
  double cap = 1.3;
  double log_ratio_clamp = 20.0;
  void validate(std::string_view fn) const {
    if (!(alpha > 0.0 && alpha <= 4.0)) ulorl::detail::fail_value(fn, "alpha", alpha, "must be in (0, 4]");
  }
  template <class T>
  [[nodiscard]] power_params<T> params() const noexcept {
    return {static_cast<T>(log_ratio_clamp), static_cast<T>(alpha), static_cast<T>(cap)};
  }
  template <class L>
  [[nodiscard]] static ULORL_ALWAYS_INLINE ulorl::objective_lanes<L> token(const ulorl::token_args<L>& a,
                                                                          const power_params<typename L::value_type>& p) noexcept {
    using V = typename L::V;
    using C = ulorl::detail::exp_constants<typename L::value_type>;
    V em1{};
    // r^alpha = exp(alpha log r); d/d logp = alpha r^alpha where the log-ratio clamp passes.
    const V ra = L::exp_in_range(L::clamp(p.alpha * a.ratio.log_ratio, L::splat(C::lo), L::splat(C::hi)), em1);
    const typename L::M pass = a.ratio.x == a.ratio.log_ratio;
    ulorl::objective_lanes<L> o;
    o.loss = -a.adv * ra;
    o.dloss = L::select(pass, -a.adv * p.alpha * ra, L::splat(typename L::value_type(0)));
    o.flags.clipped = a.ratio.ratio > p.cap;
    return o;
  }
};

// ---- the estimator: 2 (cosh u - 1), u = ref - logp; d/d logp = -2 sinh u -----------------------

struct cosh_estimator {
  [[maybe_unused]] static constexpr std::string_view name = "cosh";
  template <class L>
  static ULORL_ALWAYS_INLINE void raw(typename L::V u, typename L::V, const ulorl::kl_params<typename L::value_type>&,
                                      typename L::V& v, typename L::V& dv) noexcept {
    using T = typename L::value_type;
    using C = ulorl::detail::exp_constants<T>;
    typename L::V e1{}, e2{};
    const auto ep = L::exp_in_range(L::clamp(u, L::splat(C::lo), L::splat(C::hi)), e1);
    const auto en = L::exp_in_range(L::clamp(-u, L::splat(C::lo), L::splat(C::hi)), e2);
    v = e1 + e2;  // (e^u - 1 - u) + (e^-u - 1 + u)
    dv = en - ep;
  }
};

// ---- float64 oracle from the formulas above ------------------------------------------------------

struct problem {
  std::size_t B, T;
  std::vector<double> lp, old, ref, adv, w;
  std::vector<std::uint8_t> mask;
};

problem random_problem(std::mt19937_64& rng, std::size_t B, std::size_t T) {
  std::uniform_real_distribution<double> u(0, 1);
  problem p{B, T, {}, {}, {}, {}, {}, {}};
  for (std::size_t i = 0; i < B * T; ++i) {
    p.old.push_back(-3 * u(rng) - 0.05);
    p.lp.push_back(p.old.back() + (u(rng) - 0.5) * 1.2);
    p.ref.push_back(p.lp.back() + (u(rng) - 0.5) * 0.8);
    p.adv.push_back((u(rng) - 0.5) * 3);
    p.w.push_back(0.5 + u(rng));
    p.mask.push_back(u(rng) < 0.85 ? 1 : 0);
  }
  return p;
}

//! The loss of the whole batch in float64 (token-mean over `denominator`), from the definitions.
double oracle_loss(const problem& p, const std::vector<double>& lp, double alpha, double beta, bool weights, double denominator) {
  double s = 0;
  for (std::size_t i = 0; i < p.B * p.T; ++i) {
    if (p.mask[i] == 0) continue;
    const double x = std::clamp(lp[i] - p.old[i], -20.0, 20.0);
    const double obj = -p.adv[i] * std::exp(alpha * x);
    const double u = p.ref[i] - lp[i];
    const double kl = 2 * (std::cosh(u) - 1);
    s += (weights ? p.w[i] : 1.0) * obj + beta * kl;
  }
  return s / denominator;
}

template <class T>
struct run_out {
  ulorl::policy_loss_result res;
  std::vector<T> grad;
};

//! policy_loss_with on the problem: unit-stride rows (SIMD) or every element at column stride 2 (the
//! strided loop).
template <class T>
run_out<T> run(const problem& p, const ulorl::policy_loss_config& cfg, bool strided, bool weights) {
  const std::size_t s = strided ? 2 : 1, N = p.B * p.T;
  std::vector<T> lp(N * s, T(-77)), old(N * s, T(-77)), ref(N * s, T(-77)), adv(N * s, T(-77)), w(N * s, T(-77)),
      g(N * s, T(-99));
  std::vector<std::uint8_t> m(N * s, 7);
  for (std::size_t i = 0; i < N; ++i) {
    lp[i * s] = static_cast<T>(p.lp[i]), old[i * s] = static_cast<T>(p.old[i]), ref[i * s] = static_cast<T>(p.ref[i]);
    adv[i * s] = static_cast<T>(p.adv[i]), w[i * s] = static_cast<T>(p.w[i]), m[i * s] = p.mask[i];
  }
  const auto in_view = [&](const std::vector<T>& v) {
    return ulorl::token_view<const T>::padded(ulorl::matrix_view<const T>(v.data(), p.B, p.T, p.T * s, s));
  };
  ulorl::policy_loss_inputs<T, std::uint8_t> in{
      in_view(lp), in_view(old), in_view(adv),
      ulorl::token_view<const std::uint8_t>::padded(ulorl::matrix_view<const std::uint8_t>(m.data(), p.B, p.T, p.T * s, s)),
      in_view(ref)};
  if (weights) in.weights = in_view(w);
  const auto gv = ulorl::token_view<T>::padded(ulorl::matrix_view<T>(g.data(), p.B, p.T, p.T * s, s));
  run_out<T> out;
  out.res = ulorl::policy_loss_with(power_ratio_objective{}, cosh_estimator{}, in, gv, cfg);
  // Every overload (an empty grad_entropy given, an executor given) computes the same bits.
  std::vector<T> g2(N * s, T(-99)), g3(N * s, T(-99)), g4(N * s, T(-99));
  const auto view_of = [&](std::vector<T>& v) {
    return ulorl::token_view<T>::padded(ulorl::matrix_view<T>(v.data(), p.B, p.T, p.T * s, s));
  };
  const ulorl::token_view<T> no_entropy{};
  const power_ratio_objective obj{};
  REQUIRE(ulorl::policy_loss_with(obj, cosh_estimator{}, in, view_of(g2), no_entropy, cfg).loss == out.res.loss);
  REQUIRE(g2 == g);
  REQUIRE(ulorl::policy_loss_with(obj, cosh_estimator{}, in, view_of(g2), no_entropy, cfg, ulorl::thread_executor{2}).loss ==
          out.res.loss);
  REQUIRE(g2 == g);
  // The built-in estimator of cfg.kl: the three forms agree.
  const double builtin = ulorl::policy_loss_with(obj, in, view_of(g3), cfg).loss;
  REQUIRE(ulorl::policy_loss_with(obj, in, view_of(g4), no_entropy, cfg).loss == builtin);
  REQUIRE(g4 == g3);
  REQUIRE(ulorl::policy_loss_with(obj, in, view_of(g4), no_entropy, cfg, ulorl::thread_executor{2}).loss == builtin);
  REQUIRE(g4 == g3);
  for (std::size_t i = 0; i < N; ++i) out.grad.push_back(g[i * s]);
  if (strided)
    for (std::size_t i = 0; i < N; ++i) REQUIRE(g[i * s + 1] == T(-99));  // the gaps are not written
  return out;
}

ulorl::policy_loss_config config(double beta, double denominator) {
  ulorl::policy_loss_config c;
  c.kl_coef = beta;
  c.normalizer = {ulorl::agg_mode::token_mean, denominator, 1.0};
  return c;
}

}  // namespace

TEST_CASE("extension: an objective and an estimator defined outside the library run through the scalar, strided and SIMD paths") {
  constexpr std::uint64_t seed = 20261201;
  std::printf("test_loss_policy_loss_extension seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  for (const std::size_t T : {std::size_t{1}, std::size_t{7}, std::size_t{64}, std::size_t{301}})
    for (const bool weights : {false, true}) {
      INFO("T = " << T << " weights = " << weights);
      const problem p = random_problem(rng, 3, T);
      const double denominator = 17.0, beta = 0.3;
      const auto cfg = config(beta, denominator);
      const auto simd = run<double>(p, cfg, false, weights);
      const auto strided = run<double>(p, cfg, true, weights);
      // The loss against the oracle; the SIMD and strided paths evaluate the same function.
      REQUIRE(simd.res.loss == Approx(oracle_loss(p, p.lp, 0.5, beta, weights, denominator)).epsilon(1e-12).margin(1e-14));
      REQUIRE(strided.res.loss == Approx(simd.res.loss).epsilon(1e-13).margin(1e-15));
      REQUIRE(strided.res.metrics.clipped == simd.res.metrics.clipped);
      REQUIRE(strided.res.metrics.tokens == simd.res.metrics.tokens);
      double clipped = 0;
      for (std::size_t i = 0; i < p.B * T; ++i) {
        // Per token: the scalar entry point, the strided loop and the SIMD kernel agree.
        const auto t = ulorl::policy_token_loss_with(power_ratio_objective{}, cosh_estimator{}, p.lp[i], p.old[i], p.ref[i],
                                                     p.adv[i], weights ? p.w[i] : 1.0, 0.0, cfg);
        const double expect = p.mask[i] != 0 ? t.dlogp / denominator : 0.0;
        REQUIRE(simd.grad[i] == Approx(expect).epsilon(1e-14).margin(1e-300));
        REQUIRE(strided.grad[i] == Approx(expect).epsilon(1e-14).margin(1e-300));
        if (p.mask[i] != 0) clipped += std::exp(std::clamp(p.lp[i] - p.old[i], -20.0, 20.0)) > 1.3;
        // Central finite difference of the oracle loss.
        if (p.mask[i] == 0) continue;
        std::vector<double> up = p.lp, dn = p.lp;
        const double h = 1e-6;
        up[i] += h, dn[i] -= h;
        const double fd = (oracle_loss(p, up, 0.5, beta, weights, denominator) - oracle_loss(p, dn, 0.5, beta, weights, denominator)) / (2 * h);
        REQUIRE(simd.grad[i] == Approx(fd).epsilon(1e-6).margin(1e-9));
      }
      REQUIRE(simd.res.metrics.clipped == clipped);
      // float: the same paths agree to float rounding.
      const auto sf = run<float>(p, cfg, false, weights), tf = run<float>(p, cfg, true, weights);
      REQUIRE(sf.res.loss == Approx(simd.res.loss).epsilon(2e-5).margin(1e-6));
      for (std::size_t i = 0; i < p.B * T; ++i) {
        REQUIRE(sf.grad[i] == Approx(tf.grad[i]).epsilon(1e-6).margin(1e-12));
        REQUIRE(sf.grad[i] == Approx(simd.grad[i]).epsilon(2e-5).margin(1e-7));
      }
    }
}

TEST_CASE("extension: the descriptor's own validation runs, and nothing is written when it fails") {
  std::mt19937_64 rng(3);
  const problem p = random_problem(rng, 2, 5);
  std::vector<double> g(10, -99.0);
  const auto v = [&](const std::vector<double>& x) {
    return ulorl::token_view<const double>::padded(ulorl::matrix_view<const double>(x.data(), 2, 5));
  };
  const ulorl::policy_loss_inputs<double, std::uint8_t> in{
      v(p.lp), v(p.old), v(p.adv),
      ulorl::token_view<const std::uint8_t>::padded(ulorl::matrix_view<const std::uint8_t>(p.mask.data(), 2, 5)), v(p.ref)};
  power_ratio_objective bad;
  bad.alpha = 9.0;
  const auto gv = ulorl::token_view<double>::padded(ulorl::matrix_view<double>(g.data(), 2, 5));
  REQUIRE_THROWS_WITH(ulorl::policy_loss_with(bad, in, gv, config(0.0, 10.0)), Catch::Contains("policy_loss_with") && Catch::Contains("'alpha'"));
  REQUIRE(std::all_of(g.begin(), g.end(), [](double x) { return x == -99.0; }));
}

TEST_CASE("policy_loss: an unknown objective kind or KL estimator is rejected naming it, and nothing is written") {
  std::mt19937_64 rng(4);
  const problem p = random_problem(rng, 2, 9);
  std::vector<float> lp(p.lp.begin(), p.lp.end()), old(p.old.begin(), p.old.end()), adv(p.adv.begin(), p.adv.end()),
      ref(p.ref.begin(), p.ref.end()), g(18, -99.0f);
  const auto v = [&](const std::vector<float>& x) {
    return ulorl::token_view<const float>::padded(ulorl::matrix_view<const float>(x.data(), 2, 9));
  };
  const ulorl::policy_loss_inputs<float, std::uint8_t> in{
      v(lp), v(old), v(adv),
      ulorl::token_view<const std::uint8_t>::padded(ulorl::matrix_view<const std::uint8_t>(p.mask.data(), 2, 9)), v(ref)};
  const auto gv = ulorl::token_view<float>::padded(ulorl::matrix_view<float>(g.data(), 2, 9));
  auto cfg = config(0.1, 18.0);
  cfg.objective.kind = static_cast<ulorl::objective_kind>(42);
  REQUIRE_THROWS_WITH(ulorl::policy_loss(in, gv, cfg),
                      Catch::StartsWith("ulorl::policy_loss: argument 'kind' = 42: unknown enum value"));
  cfg.objective.kind = ulorl::objective_kind::sapo;
  cfg.kl.estimator = static_cast<ulorl::kl_estimator>(9);
  REQUIRE_THROWS_WITH(ulorl::policy_loss(in, gv, cfg),
                      Catch::StartsWith("ulorl::policy_loss: argument 'estimator' = 9: unknown enum value"));
  // With kl_coef = 0 the estimator is unused, but still validated.
  cfg.kl_coef = 0.0;
  REQUIRE_THROWS_WITH(ulorl::policy_loss(in, gv, cfg), Catch::Contains("'estimator'"));
  REQUIRE(std::all_of(g.begin(), g.end(), [](float x) { return x == -99.0f; }));
  // The per-token API of a configuration validation rejects gives NaN, never a plausible value.
  cfg.kl.estimator = ulorl::kl_estimator::k3;
  cfg.objective.kind = static_cast<ulorl::objective_kind>(42);
  const auto t = ulorl::policy_token_loss(-1.0, -1.1, -1.2, 0.5, 1.0, 0.0, ulorl::make_token_loss_params<double>(cfg));
  REQUIRE(std::isnan(t.loss));
  REQUIRE(std::isnan(t.dlogp));
  cfg.objective.kind = ulorl::objective_kind::gspo;  // sequence-level: needs the row
  REQUIRE(std::isnan(ulorl::policy_token_loss(-1.0, -1.1, -1.2, 0.5, 1.0, 0.0, ulorl::make_token_loss_params<double>(cfg)).loss));
}
