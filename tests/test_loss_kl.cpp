// Tests of ulorl/loss/kl.hpp: each estimator against its textbook formula, gradients against finite
// differences, clamps and straight-through, k3 >= 0, the batch function and the reward penalty.
#include <ulorl/loss/kl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "support/rejection.hpp"

namespace {
constexpr std::uint64_t seed = 313;
constexpr double inf = std::numeric_limits<double>::infinity();
double ref_value(ulorl::kl_estimator e, double lp, double ref, double in, double out) {
  const double u = std::clamp(ref - lp, -in, in);
  double v = 0;
  switch (e) {
    case ulorl::kl_estimator::k1: v = -u; break;
    case ulorl::kl_estimator::abs: v = std::fabs(u); break;
    case ulorl::kl_estimator::k2: v = u * u / 2; break;
    case ulorl::kl_estimator::k3: v = std::exp(u) - u - 1; break;
  }
  return std::clamp(v, -out, out);
}
}  // namespace

TEST_CASE("kl_term: values and finite-difference gradients for every estimator and clamp setting") {
  std::printf("test_loss_kl seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-4, 4);
  for (auto e : {ulorl::kl_estimator::k1, ulorl::kl_estimator::abs, ulorl::kl_estimator::k2, ulorl::kl_estimator::k3})
    for (double in : {inf, 2.0})
      for (double out : {inf, 1.5}) {
        const auto p = ulorl::make_kl_params<double>({.estimator = e, .input_clamp = in, .output_clamp = out});
        for (int i = 0; i < 3000; ++i) {
          const double lp = -2 + u(rng), ref = lp + u(rng);
          const auto k = ulorl::kl_term(lp, ref, p);
          REQUIRE(k.value == Approx(ref_value(e, lp, ref, in, out)).epsilon(1e-13).margin(1e-15));
          auto f = [&](double h) { return ref_value(e, lp + h, ref, in, out); };
          const double fd = (f(1e-6) - f(-1e-6)) / 2e-6, fdb = (f(1e-4) - f(-1e-4)) / 2e-4;
          if (std::fabs(fd - fdb) > 1e-5 * (1 + std::fabs(fd))) continue;  // next to a clamp bound
          REQUIRE(k.grad == Approx(fd).epsilon(1e-6).margin(1e-8));
          if (e == ulorl::kl_estimator::k3) REQUIRE(k.value >= 0);
        }
      }
}

TEST_CASE("kl_term: k3 >= 0 everywhere, straight-through gradient, extreme inputs finite") {
  const auto k3 = ulorl::make_kl_params<double>({.estimator = ulorl::kl_estimator::k3});
  for (double d : {-1e4, -50.0, -1e-9, 0.0, 1e-12, 3.0, 50.0, 700.0, 1e4}) {
    const auto k = ulorl::kl_term(-1e4 + d, -1e4, k3);
    REQUIRE(k.value >= 0);
    REQUIRE(std::isfinite(k.value));
    REQUIRE(std::isfinite(k.grad));
  }
  const auto st = ulorl::make_kl_params<double>({.estimator = ulorl::kl_estimator::k3, .straight_through = true,
                                                 .input_clamp = 20, .output_clamp = 10});
  const auto k = ulorl::kl_term(-1.0, -30.0, st);  // both clamps active
  REQUIRE(k.value == 10.0);
  REQUIRE(k.grad == 29.0);  // d = logp - ref, never clamped
  const auto plain = ulorl::make_kl_params<double>({.estimator = ulorl::kl_estimator::k3, .input_clamp = 20, .output_clamp = 10});
  REQUIRE(ulorl::kl_term(-1.0, -30.0, plain).grad == 0.0);
  REQUIRE(ulorl::make_kl_params<float>({}).estimator == ulorl::kl_estimator::k3);
  const auto kf = ulorl::kl_term(-1e4f, -1e4f + 50.0f, ulorl::make_kl_params<float>({}));
  REQUIRE(std::isfinite(kf.value));
  REQUIRE(std::isfinite(kf.grad));
}

TEST_CASE("kl_penalty (batch) and kl_penalized_rewards; bad input leaves outputs untouched") {
  const std::size_t B = 2, T = 3;
  std::vector<double> lp{-1, -2, -3, -0.5, -0.1, -4}, ref{-1.5, -2, -2, -0.4, -3, -4.2}, kl(B * T, 7.0), g(B * T, 7.0);
  auto cv = [&](const std::vector<double>& v) { return ulorl::token_view<const double>::padded(ulorl::matrix_view<const double>(v.data(), B, T)); };
  auto mv = [&](std::vector<double>& v) { return ulorl::token_view<double>::padded(ulorl::matrix_view<double>(v.data(), B, T)); };
  ulorl::kl_penalty(cv(lp), cv(ref), mv(kl), mv(g), {.estimator = ulorl::kl_estimator::k2});
  for (std::size_t i = 0; i < B * T; ++i) {
    REQUIRE(kl[i] == Approx(0.5 * (lp[i] - ref[i]) * (lp[i] - ref[i])));
    REQUIRE(g[i] == Approx(lp[i] - ref[i]));
  }
  std::vector<double> rewards{0, 0, 1, 0, 0, 2}, mask{1, 1, 1, 1, 1, 0}, out(B * T, 7.0);
  const double mean = ulorl::kl_penalized_rewards<double, double>(cv(rewards), cv(lp), cv(ref), cv(mask), mv(out),
                                                                  0.1, {.estimator = ulorl::kl_estimator::k1});
  double s = 0;
  for (std::size_t i = 0; i < 5; ++i) {
    REQUIRE(out[i] == Approx(rewards[i] - 0.1 * (lp[i] - ref[i])));
    s += lp[i] - ref[i];
  }
  REQUIRE(out[5] == 0.0);
  REQUIRE(mean == Approx(s / 5));
  // Bad input.
  std::vector<double> sentinel(B * T, 3.0), sentinel2(B * T, 3.0);
  lp[4] = std::nan("");
  try {
    ulorl::kl_penalty(cv(lp), cv(ref), mv(sentinel), mv(sentinel2), {});
    FAIL("no error");
  } catch (const ulorl::error& e) {
    REQUIRE(e.argument() == "log_prob");
    REQUIRE(e.index() == 4);
  }
  lp[4] = -0.1;
  std::vector<double> short_ref(B * 2, 0.0);
  REQUIRE_THROWS_AS((ulorl::kl_penalty(cv(lp), ulorl::token_view<const double>::padded(ulorl::matrix_view<const double>(short_ref.data(), B, 2)),
                                      mv(sentinel), mv(sentinel2), {})),
                    ulorl::error);
  REQUIRE_THROWS_AS(ulorl::kl_penalty(cv(lp), cv(ref), mv(sentinel), mv(sentinel2), {.output_clamp = 0.0}), ulorl::error);
  for (double v : sentinel) REQUIRE(v == 3.0);
  for (double v : sentinel2) REQUIRE(v == 3.0);
}

// ---- kl_penalty / kl_penalized_rewards: references on ragged batches, and every rejected input ----

namespace {

const ulorl::kl_estimator estimators[] = {ulorl::kl_estimator::k1, ulorl::kl_estimator::abs, ulorl::kl_estimator::k2,
                                          ulorl::kl_estimator::k3};

//! The inputs of kl_penalized_rewards, each with its own shape (all equal unless a test changes one).
template <class M>
struct penalty_case {
  shape s_rewards, s_lp, s_ref, s_mask, s_out;
  std::vector<double> rewards, lp, ref, out;
  std::vector<M> mask;
  bool with_mask = true;
  double beta = 0.1;
  ulorl::kl_config cfg{};
  explicit penalty_case(const shape& s) : s_rewards(s), s_lp(s), s_ref(s), s_mask(s), s_out(s) {
    for (auto* v : {&rewards, &lp, &ref}) v->assign(s.size(), -0.5);
    for (std::size_t i = 0; i < s.size(); ++i) lp[i] = -0.1 * static_cast<double>(i + 1), rewards[i] = i % 3 == 0 ? 1.0 : 0.0;
    mask.assign(s.size(), M(1));
    if (s.size() > 2) mask[1] = M(0);
    out.assign(s.size(), 7.0);
  }
  //! Gives argument `arg` the shape `s` (valid values, the right count for that shape).
  void reshape(const std::string& arg, const shape& s) {
    if (arg == "rewards") s_rewards = s, rewards.assign(s.size(), 0.5);
    if (arg == "log_prob") s_lp = s, lp.assign(s.size(), -0.5);
    if (arg == "ref_log_prob") s_ref = s, ref.assign(s.size(), -0.5);
    if (arg == "mask") s_mask = s, mask.assign(s.size(), M(1));
    if (arg == "out") s_out = s, out.assign(s.size(), 7.0);
  }
  double run() {
    return ulorl::kl_penalized_rewards<double, M>(view_of<const double>(rewards.data(), s_rewards), view_of<const double>(lp.data(), s_lp),
                                                  view_of<const double>(ref.data(), s_ref),
                                                  with_mask ? view_of<const M>(mask.data(), s_mask) : ulorl::token_view<const M>{},
                                                  view_of<double>(out.data(), s_out), beta, cfg);
  }
};
}  // namespace

TEST_CASE("kl_penalized_rewards: every estimator, clamp and straight-through on ragged masks against a float64 reference") {
  // out[b,t] = (r[b,t] - beta * kl[b,t]) * m[b,t] per token (the header's documented semantics:
  // the penalty goes on every valid token, not summed into the last one); returns the masked mean
  // KL (0 without valid tokens).
  std::mt19937_64 rng(seed + 11);
  std::uniform_real_distribution<double> u(0, 1);
  const std::vector<shape> shapes{{4, 6, {}}, {0, 0, {0, 5, 5, 7, 13}}};
  int calls = 0;
  for (const shape& s : shapes) {
    const std::size_t n = s.size();
    std::vector<double> rewards(n), lp(n), ref(n);
    for (std::size_t i = 0; i < n; ++i) {
      lp[i] = -6 * u(rng);
      ref[i] = lp[i] + (u(rng) - 0.5) * 7;  // |ref - logp| up to 3.5: both clamps below are active somewhere
      rewards[i] = u(rng) < 0.3 ? (u(rng) < 0.5 ? 1.0 : -1.0) : 0.0;
    }
    // Masks: ragged with holes and one all-masked row; all valid; none valid; and "no mask".
    std::vector<std::vector<double>> masks(3, std::vector<double>(n, 1.0));
    for (std::size_t b = 0; b < s.rows(); ++b)
      for (std::size_t t = 0; t < s.row_size(b); ++t)
        masks[0][s.row_begin(b) + t] = (b == 2 || (t + b) % 4 == 3) ? 0.0 : 1.0;
    std::fill(masks[2].begin(), masks[2].end(), 0.0);
    for (int mi = 0; mi < 4; ++mi) {
      const bool with_mask = mi < 3;
      const std::vector<double>& m = masks[with_mask ? mi : 1];
      std::vector<std::uint8_t> m8(m.begin(), m.end());
      std::vector<float> mf(m.begin(), m.end());
      for (auto e : estimators)
        for (double in : {inf, 2.0})
          for (double outc : {inf, 1.5})
            for (bool st : {false, true})
              for (double beta : {0.05, 0.0, -0.3}) {
                INFO("layout " << (s.offsets.empty() ? "padded" : "packed") << " mask " << mi << " estimator "
                               << static_cast<int>(e) << " in " << in << " out " << outc << " st " << st << " beta " << beta);
                const ulorl::kl_config cfg{.estimator = e, .straight_through = st, .input_clamp = in, .output_clamp = outc};
                double sum = 0, cnt = 0;
                std::vector<double> expect(n);
                for (std::size_t i = 0; i < n; ++i) {
                  const double k = ref_value(e, lp[i], ref[i], in, outc);
                  expect[i] = m[i] != 0 ? rewards[i] - beta * k : 0.0;
                  if (m[i] != 0) sum += k, cnt += 1;
                }
                const double mean = cnt > 0 ? sum / cnt : 0.0;
                std::vector<double> out(n, 7.0), out8(n, 7.0);
                const double got = ulorl::kl_penalized_rewards<double, double>(
                    view_of<const double>(rewards.data(), s), view_of<const double>(lp.data(), s), view_of<const double>(ref.data(), s),
                    with_mask ? view_of<const double>(m.data(), s) : ulorl::token_view<const double>{}, view_of<double>(out.data(), s), beta, cfg);
                const double got8 = ulorl::kl_penalized_rewards<double, std::uint8_t>(
                    view_of<const double>(rewards.data(), s), view_of<const double>(lp.data(), s),
                    view_of<const double>(ref.data(), s),
                    with_mask ? view_of<const std::uint8_t>(m8.data(), s) : ulorl::token_view<const std::uint8_t>{},
                    view_of<double>(out8.data(), s), beta, cfg);
                calls += 2;
                REQUIRE(got == Approx(mean).epsilon(1e-12).margin(1e-14));
                REQUIRE(got8 == got);
                for (std::size_t i = 0; i < n; ++i) {
                  INFO("flat index " << i);
                  if (m[i] == 0) REQUIRE(out[i] == 0.0);  // exactly 0, the sentinel overwritten
                  REQUIRE(out[i] == Approx(expect[i]).epsilon(1e-12).margin(1e-14));
                  if (beta == 0.0 && m[i] != 0) REQUIRE(out[i] == rewards[i]);
                  REQUIRE(out8[i] == out[i]);
                }
                // float: inputs rounded to float, the KL in float, the penalty in double then rounded.
                std::vector<float> rf(rewards.begin(), rewards.end()), lf(lp.begin(), lp.end()), ff(ref.begin(), ref.end()), of(n, 7.0f);
                const double gotf = ulorl::kl_penalized_rewards<float, float>(
                    view_of<const float>(rf.data(), s), view_of<const float>(lf.data(), s), view_of<const float>(ff.data(), s),
                    with_mask ? view_of<const float>(mf.data(), s) : ulorl::token_view<const float>{}, view_of<float>(of.data(), s), beta, cfg);
                ++calls;
                double sumf = 0;
                for (std::size_t i = 0; i < n; ++i) {
                  const double k = ref_value(e, lf[i], ff[i], in, outc);
                  if (m[i] != 0) sumf += k;
                  REQUIRE(static_cast<double>(of[i]) == Approx(m[i] != 0 ? static_cast<double>(rf[i]) - beta * k : 0.0).epsilon(1e-5).margin(3e-5));
                }
                REQUIRE(gotf == Approx(cnt > 0 ? sumf / cnt : 0.0).epsilon(1e-5).margin(3e-5));
              }
    }
  }
  REQUIRE(calls == 2 * 4 * 4 * 2 * 2 * 2 * 3 * 3);
}

TEST_CASE("kl_penalty (batch): every estimator and clamp on padded and packed batches against a float64 reference") {
  std::mt19937_64 rng(seed + 12);
  std::uniform_real_distribution<double> u(0, 1);
  for (const shape& s : {shape{4, 6, {}}, shape{0, 0, {0, 5, 5, 7, 13}}}) {
    const std::size_t n = s.size();
    std::vector<double> lp(n), ref(n);
    for (std::size_t i = 0; i < n; ++i) lp[i] = -6 * u(rng), ref[i] = lp[i] + (u(rng) - 0.5) * 7;
    for (auto e : estimators)
      for (double in : {inf, 2.0})
        for (double outc : {inf, 1.5})
          for (bool st : {false, true}) {
            INFO("estimator " << static_cast<int>(e) << " in " << in << " out " << outc << " st " << st);
            const ulorl::kl_config cfg{.estimator = e, .straight_through = st, .input_clamp = in, .output_clamp = outc};
            std::vector<double> kl(n, 7.0), g(n, 7.0), kl2(n, 7.0);
            ulorl::kl_penalty(view_of<const double>(lp.data(), s), view_of<const double>(ref.data(), s),
                              view_of<double>(kl.data(), s), view_of<double>(g.data(), s), cfg);
            ulorl::kl_penalty(view_of<const double>(lp.data(), s), view_of<const double>(ref.data(), s),
                              view_of<double>(kl2.data(), s), ulorl::token_view<double>{}, cfg);  // grad is optional
            for (std::size_t i = 0; i < n; ++i) {
              REQUIRE(kl[i] == Approx(ref_value(e, lp[i], ref[i], in, outc)).epsilon(1e-13).margin(1e-15));
              REQUIRE(kl2[i] == kl[i]);
              if (st) {
                REQUIRE(g[i] == lp[i] - ref[i]);  // straight-through: the k2 gradient d, never clamped
                continue;
              }
              auto f = [&](double h) { return ref_value(e, lp[i] + h, ref[i], in, outc); };
              const double fd = (f(1e-6) - f(-1e-6)) / 2e-6, fdb = (f(1e-4) - f(-1e-4)) / 2e-4;
              if (std::fabs(fd - fdb) > 1e-5 * (1 + std::fabs(fd))) continue;  // next to a clamp bound
              REQUIRE(g[i] == Approx(fd).epsilon(1e-6).margin(1e-8));
            }
          }
  }
}

TEST_CASE("kl_penalized_rewards: bad input names the argument and the flat index; outputs untouched") {
  const std::string fn = "kl_penalized_rewards";
  const char* args[] = {"rewards", "log_prob", "ref_log_prob", "mask", "out"};
  int rejected = 0;
  for (const shape& base : {padded_shape, packed_shape}) {
    INFO("base layout " << (base.offsets.empty() ? "padded" : "packed"));
    {
      penalty_case<double> ok(base);
      REQUIRE_NOTHROW(ok.run());
    }
    // Shapes: each argument in turn the odd one out; every pair of arguments then disagrees in some
    // case. The error names the odd one (the first compared with 'rewards' when 'rewards' is odd).
    for (const char* odd : args)
      for (const shape& w : wrong_shapes(base)) {
        penalty_case<double> c(base);
        c.reshape(odd, w);
        INFO("odd argument " << odd << ", " << w.rows() << " rows, " << w.size() << " elements");
        require_rejected(outcome_of([&] { c.run(); }), fn, std::string(odd) == "rewards" ? "log_prob" : odd, -1);
        REQUIRE(all_equal(c.out, 7.0));
        ++rejected;
      }
    // Non-finite values in every value input, at the first, a masked and the last element.
    for (const char* arg : {"rewards", "log_prob", "ref_log_prob"})
      for (double bad : {std::nan(""), inf, -inf})
        for (std::size_t i : {std::size_t{0}, std::size_t{1}, base.size() - 1}) {
          penalty_case<double> c(base);
          (std::string(arg) == "rewards" ? c.rewards : std::string(arg) == "log_prob" ? c.lp : c.ref)[i] = bad;
          INFO(arg << "[" << i << "] = " << bad);
          require_rejected(outcome_of([&] { c.run(); }), fn, arg, static_cast<std::int64_t>(i));
          REQUIRE(all_equal(c.out, 7.0));
          ++rejected;
        }
    // Masks that are not 0/1: integer 2, floating 0.5 / 2 / -1 / NaN.
    rejected += require_bad_masks_rejected<penalty_case>(base, fn, [](auto& c) -> auto& { return c.out; }, 7.0);
    // Scalars and configuration.
    auto scalar = [&](const char* arg, auto set) {
      penalty_case<double> c(base);
      set(c);
      require_rejected(outcome_of([&] { c.run(); }), fn, arg, -1);
      REQUIRE(all_equal(c.out, 7.0));
      ++rejected;
    };
    for (double bad : {std::nan(""), inf, -inf}) scalar("beta", [&](auto& c) { c.beta = bad; });
    for (double bad : {0.0, -1.0, std::nan("")}) {
      scalar("input_clamp", [&](auto& c) { c.cfg.input_clamp = bad; });
      scalar("output_clamp", [&](auto& c) { c.cfg.output_clamp = bad; });
    }
    scalar("importance_weighted", [&](auto& c) { c.cfg.importance_weighted = true; });
  }
  // Packed offsets that do not describe the 12 tokens: named on the first argument, with the offset's index.
  const std::vector<std::pair<std::vector<std::int64_t>, std::int64_t>> bad_offsets{
      {{1, 3, 3, 7, 12}, 0}, {{0, 3, 2, 7, 12}, 2}, {{0, 3, 3, 7, 11}, 4}};
  for (const auto& bad : bad_offsets) {
    const std::vector<std::int64_t>& offs = bad.first;  // not a structured binding: lambdas capture it (clang < 16)
    const std::int64_t at = bad.second;
    std::vector<double> r(12, 0.0), lp(12, -0.5), rf(12, -0.7), m(12, 1.0), out(12, 7.0);
    auto pv = [&](auto* d) {
      using V = std::remove_pointer_t<decltype(d)>;
      return ulorl::token_view<V>::packed(ulorl::vector_view<V>(d, 12), std::span<const std::int64_t>(offs));
    };
    const outcome o = outcome_of([&] {
      (void)ulorl::kl_penalized_rewards<double, double>(pv(std::as_const(r).data()), pv(std::as_const(lp).data()),
                                                        pv(std::as_const(rf).data()), pv(std::as_const(m).data()), pv(out.data()), 0.1, {});
    });
    require_rejected(o, fn, "rewards", at);
    REQUIRE(all_equal(out, 7.0));
    ++rejected;
  }
  REQUIRE(rejected == 2 * (5 * 5 + 3 * 3 * 3 + 2 * (1 + 4 * 2) + 3 + 3 * 2 + 1) + 3);
}

TEST_CASE("kl_penalty (batch): bad input names the argument and the flat index; outputs untouched") {
  const std::string fn = "kl_penalty";
  int rejected = 0;
  for (const shape& base : {padded_shape, packed_shape}) {
    INFO("base layout " << (base.offsets.empty() ? "padded" : "packed"));
    struct bufs {
      shape s_lp, s_ref, s_kl, s_g;
      std::vector<double> lp, ref, kl, g;
      bool with_grad = true;
      ulorl::kl_config cfg{};
      void run() {
        ulorl::kl_penalty(view_of<const double>(lp.data(), s_lp), view_of<const double>(ref.data(), s_ref), view_of<double>(kl.data(), s_kl),
                          with_grad ? view_of<double>(g.data(), s_g) : ulorl::token_view<double>{}, cfg);
      }
      [[nodiscard]] bool untouched() const { return all_equal(kl, 7.0) && all_equal(g, 8.0); }
    };
    auto make = [&] {
      bufs c{base, base, base, base, std::vector<double>(base.size(), -0.5), std::vector<double>(base.size(), -0.7),
             std::vector<double>(base.size(), 7.0), std::vector<double>(base.size(), 8.0)};
      return c;
    };
    {
      bufs ok = make();
      REQUIRE_NOTHROW(ok.run());
      REQUIRE(ok.kl[0] == Approx(std::exp(-0.2) + 0.2 - 1));  // default estimator k3, u = ref - logp = -0.2
    }
    for (const char* odd : {"log_prob", "ref_log_prob", "kl", "grad"})
      for (const shape& w : wrong_shapes(base)) {
        bufs c = make();
        const std::string a = odd;
        if (a == "log_prob") c.s_lp = w, c.lp.assign(w.size(), -0.5);
        if (a == "ref_log_prob") c.s_ref = w, c.ref.assign(w.size(), -0.7);
        if (a == "kl") c.s_kl = w, c.kl.assign(w.size(), 7.0);
        if (a == "grad") c.s_g = w, c.g.assign(w.size(), 8.0);
        INFO("odd argument " << odd << ", " << w.rows() << " rows, " << w.size() << " elements");
        require_rejected(outcome_of([&] { c.run(); }), fn, a == "log_prob" ? "ref_log_prob" : a, -1);
        REQUIRE(c.untouched());
        ++rejected;
        if (a == "kl" || a == "grad") {  // also without a grad output
          c.with_grad = false;
          if (a == "kl") {
            require_rejected(outcome_of([&] { c.run(); }), fn, "kl", -1);
            REQUIRE(c.untouched());
            ++rejected;
          } else {
            REQUIRE_NOTHROW(c.run());
          }
        }
      }
    for (const char* arg : {"log_prob", "ref_log_prob"})
      for (double bad : {std::nan(""), inf, -inf})
        for (std::size_t i : {std::size_t{0}, std::size_t{5}, base.size() - 1})
          for (bool with_grad : {true, false}) {
            bufs c = make();
            c.with_grad = with_grad;
            (std::string(arg) == "log_prob" ? c.lp : c.ref)[i] = bad;
            INFO(arg << "[" << i << "] = " << bad);
            require_rejected(outcome_of([&] { c.run(); }), fn, arg, static_cast<std::int64_t>(i));
            REQUIRE(c.untouched());
            ++rejected;
          }
    for (double bad : {0.0, -1.0, std::nan("")})
      for (const char* arg : {"input_clamp", "output_clamp"}) {
        bufs c = make();
        (std::string(arg) == "input_clamp" ? c.cfg.input_clamp : c.cfg.output_clamp) = bad;
        require_rejected(outcome_of([&] { c.run(); }), fn, arg, -1);
        REQUIRE(c.untouched());
        ++rejected;
      }
    bufs c = make();
    c.cfg.importance_weighted = true;
    require_rejected(outcome_of([&] { c.run(); }), fn, "importance_weighted", -1);
    REQUIRE(c.untouched());
    ++rejected;
  }
  REQUIRE(rejected == 2 * (4 * 5 + 5 + 2 * 3 * 3 * 2 + 3 * 2 + 1));
}

TEST_CASE("kl_penalized_rewards: a penalised reward beyond the element type's range is rejected, not written as inf") {
  // float, k3 without clamps: ref - logp = 100 gives a KL near float's largest value, and
  // r - 2 kl overflows float. With verl's clamps (+-20 / +-10) the same token is fine.
  const shape s{2, 3, {}};
  std::vector<float> rewards{1, 0, 0, 0, 0, 1}, lp{-0.5f, -1, -2, -3, -100, -0.1f}, ref{-0.4f, -1, -2, -3, 0, -0.2f}, out(6, 7.0f);
  std::vector<std::uint8_t> mask{1, 1, 1, 1, 1, 1};
  const auto run = [&](const ulorl::kl_config& cfg) {
    return ulorl::kl_penalized_rewards<float, std::uint8_t>(view_of<const float>(rewards.data(), s), view_of<const float>(lp.data(), s),
                                                            view_of<const float>(ref.data(), s), view_of<const std::uint8_t>(mask.data(), s),
                                                            view_of<float>(out.data(), s), 2.0, cfg);
  };
  ulorl::kl_config k3{};
  k3.estimator = ulorl::kl_estimator::k3;
  require_rejected(outcome_of([&] { (void)run(k3); }), "kl_penalized_rewards", "log_prob", 4);
  REQUIRE(all_equal(out, 7.0f));
  mask[4] = 0;  // a masked token's penalty is not written: accepted
  REQUIRE_NOTHROW(run(k3));
  REQUIRE(out[4] == 0.0f);
  mask[4] = 1;
  ulorl::kl_config clamped = k3;
  clamped.input_clamp = 20, clamped.output_clamp = 10;
  REQUIRE_NOTHROW(run(clamped));
  REQUIRE(out[4] == Approx(0.0 - 2.0 * 10.0));
  for (float v : out) REQUIRE(std::isfinite(v));
}

TEST_CASE("kl_penalty and kl_penalized_rewards: a KL beyond the range is an error, an overflowing sum is not", "[kl][overflow]") {
  const auto cv = [](const std::vector<double>& v) {
    return ulorl::token_view<const double>::padded(ulorl::matrix_view<const double>(v.data(), 1, v.size()));
  };
  const auto mv = [](std::vector<double>& v) { return ulorl::token_view<double>::padded(ulorl::matrix_view<double>(v.data(), 1, v.size())); };
  // k1 = logp - ref = 1e308 - (-1e308) overflows double.
  const std::vector<double> lp{0.5, 1e308}, ref{0.25, -1e308};
  std::vector<double> kl(2, 7.0), g(2, 8.0);
  try {
    ulorl::kl_penalty(cv(lp), cv(ref), mv(kl), mv(g), ulorl::kl_config{.estimator = ulorl::kl_estimator::k1});
    FAIL("no error");
  } catch (const ulorl::error& e) {
    INFO(e.what());
    CHECK(e.argument() == "kl");
    CHECK(e.index() == 1);
  }
  CHECK(kl == std::vector<double>{7.0, 7.0});
  CHECK(g == std::vector<double>{8.0, 8.0});
  // Two KLs of 1e308: their sum overflows, their mean does not.
  const std::vector<double> rw{0.0, 0.0}, lp2{0.5e308, 0.5e308}, ref2{-0.5e308, -0.5e308};
  std::vector<double> out(2);
  const double mean = ulorl::kl_penalized_rewards(cv(rw), cv(lp2), cv(ref2), ulorl::token_view<const double>{}, mv(out), 1e-300,
                                                  ulorl::kl_config{.estimator = ulorl::kl_estimator::k1});
  CHECK(mean == 1e308);
  CHECK(out[0] == Approx(-1e8));
}
