// Fuzz target: policy_loss (ulorl/loss/policy_loss.hpp) over fuzzed shapes, layouts (padded [B, T]
// with per-array strides, packed with int32 or int64 offsets, possibly malformed), values and
// configurations (objective, KL estimator, aggregation mode and sequence gradient as raw enum values,
// out-of-range ones included). Each call either throws ulorl::error, and then no output element has
// changed (or, for a result found out of its type's range after the pass, every gradient element in
// the views is 0 and the error says so), or returns; then elements outside the gradient views are untouched, masked tokens get a
// zero gradient, the metrics count the valid tokens, sequences and rows, and with moderate inputs
// (log-probs in [-20, 0], bounded coefficients, a normaliser >= 1e-3) everything is finite.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>
#include <vector>

#include "fuzz_common.hpp"
#include "ulorl/loss.hpp"

namespace {

//! The number of values a name table names (enums number them from 0 without gaps).
template <class Table>
constexpr int named(const Table& t) {
  return static_cast<int>(std::size(t));
}

constexpr double sentinel = -12345.25;  // exact in float and double

struct shape {
  bool packed = false;
  std::size_t rows = 0, cols = 0;
  std::vector<std::int64_t> off64;
  std::vector<std::int32_t> off32;
  bool use32 = false;
  std::size_t tokens = 0;  // packed: values per array
};

//! One array of the batch: its own buffer and strides, the same (b, t) set as the others.
template <class T>
struct array {
  std::vector<T> buf;
  std::vector<std::size_t> addr;  // buffer index of each element, row-major over (b, t)
  ulorl::token_view<T> view;
};

template <class T>
array<T> make_array(const shape& s, FuzzedDataProvider& p, bool present) {
  array<T> a;
  if (!present) return a;
  if (!s.packed) {
    const auto cs = static_cast<std::size_t>(p.ConsumeIntegralInRange<int>(1, 3));
    const std::size_t rs = s.cols * cs + static_cast<std::size_t>(p.ConsumeIntegralInRange<int>(0, 3));
    const std::size_t n = s.rows == 0 || s.cols == 0 ? 0 : (s.rows - 1) * rs + (s.cols - 1) * cs + 1;
    a.buf.assign(n + static_cast<std::size_t>(p.ConsumeIntegralInRange<int>(0, 2)), T(sentinel));
    for (std::size_t b = 0; b < s.rows; ++b)
      for (std::size_t t = 0; t < s.cols; ++t) a.addr.push_back(b * rs + t * cs);
    a.view = ulorl::padded(ulorl::matrix_view<T>(a.buf.data(), s.rows, s.cols, static_cast<std::ptrdiff_t>(rs),
                                                 static_cast<std::ptrdiff_t>(cs)));
  } else {
    const auto st = static_cast<std::size_t>(p.ConsumeIntegralInRange<int>(1, 3));
    a.buf.assign(s.tokens == 0 ? 0 : (s.tokens - 1) * st + 1, T(sentinel));
    for (std::size_t i = 0; i < s.tokens; ++i) a.addr.push_back(i * st);
    const ulorl::vector_view<T> v(a.buf.data(), s.tokens, static_cast<std::ptrdiff_t>(st));
    a.view = s.use32 ? ulorl::token_view<T>::packed(v, std::span<const std::int32_t>(s.off32))
                     : ulorl::token_view<T>::packed(v, std::span<const std::int64_t>(s.off64));
  }
  return a;
}

template <class T>
double value(FuzzedDataProvider& p, bool moderate, double lo, double hi) {
  return moderate ? p.ConsumeFloatingPointInRange<double>(lo, hi) : fuzz::any_double(p);
}

template <class T>
void fill(array<T>& a, FuzzedDataProvider& p, bool moderate, double lo, double hi) {
  for (const auto i : a.addr) a.buf[i] = static_cast<T>(value<T>(p, moderate, lo, hi));
}

template <class T>
bool untouched(const array<T>& a) {
  for (const auto x : a.buf)
    if (!fuzz::same_bits(x, T(sentinel))) return false;
  return true;
}

template <class T>
void run(FuzzedDataProvider& p) {
  shape s;
  s.packed = p.ConsumeBool();
  s.rows = p.ConsumeIntegralInRange<std::size_t>(0, 5);
  if (!s.packed) {
    s.cols = p.ConsumeIntegralInRange<std::size_t>(0, 40);
  } else {
    s.use32 = p.ConsumeBool();
    std::int64_t at = 0;
    s.off64.push_back(0);
    for (std::size_t b = 0; b < s.rows; ++b) s.off64.push_back(at += p.ConsumeIntegralInRange<std::int64_t>(0, 40));
    s.tokens = static_cast<std::size_t>(at);
    if (p.ConsumeIntegralInRange<int>(0, 7) == 0) {  // malformed offsets: the layout check must reject them
      s.off64[p.ConsumeIntegralInRange<std::size_t>(0, s.off64.size() - 1)] =
          p.ConsumeIntegralInRange<std::int64_t>(-3, 90);
    }
    if (p.ConsumeIntegralInRange<int>(0, 7) == 0) s.tokens = p.ConsumeIntegralInRange<std::size_t>(0, 90);
    for (const auto o : s.off64) s.off32.push_back(static_cast<std::int32_t>(o));
  }
  const bool moderate = p.ConsumeIntegralInRange<int>(0, 3) != 0;
  const bool moderate_cfg = p.ConsumeIntegralInRange<int>(0, 3) != 0;

  ulorl::policy_loss_config cfg;
  auto& o = cfg.objective;
  // Each enum from 0 to one past its last name (the library's name tables): the last value is not one.
  const int kind = p.ConsumeIntegralInRange<int>(0, named(ulorl::objective_names));
  o.kind = static_cast<ulorl::objective_kind>(kind);
  const int seq_grad = p.ConsumeIntegralInRange<int>(0, named(ulorl::sequence_gradient_names));
  o.gspo.seq_gradient = static_cast<ulorl::sequence_gradient>(seq_grad);
  const int estimator = p.ConsumeIntegralInRange<int>(0, named(ulorl::kl_estimator_names));
  cfg.kl.estimator = static_cast<ulorl::kl_estimator>(estimator);
  cfg.kl.straight_through = p.ConsumeBool();
  cfg.kl.importance_weighted = p.ConsumeBool();
  const int mode = p.ConsumeIntegralInRange<int>(0, named(ulorl::agg_mode_names));
  cfg.normalizer.mode = static_cast<ulorl::agg_mode>(mode);
  cfg.check_values = p.ConsumeIntegralInRange<int>(0, 3) != 0;
  if (moderate_cfg) {
    o.eps_low = p.ConsumeFloatingPointInRange<double>(0.0, 0.99);
    o.eps_high = p.ConsumeFloatingPointInRange<double>(0.0, 10.0);
    o.dual_clip = p.ConsumeBool() ? 0.0 : p.ConsumeFloatingPointInRange<double>(1.01, 10.0);
    o.delta = p.ConsumeBool() ? 0.0 : p.ConsumeFloatingPointInRange<double>(1.01, 10.0);
    o.log_ratio_clamp = p.ConsumeFloatingPointInRange<double>(0.01, 20.0);
    o.gspo.seq_log_ratio_max = p.ConsumeFloatingPointInRange<double>(-20.0, 20.0);
    o.sapo.tau_pos = p.ConsumeFloatingPointInRange<double>(0.01, 10.0);
    o.sapo.tau_neg = p.ConsumeFloatingPointInRange<double>(0.01, 10.0);
    cfg.kl.input_clamp = p.ConsumeBool() ? ulorl::no_limit : p.ConsumeFloatingPointInRange<double>(0.1, 50.0);
    cfg.kl.output_clamp = p.ConsumeBool() ? ulorl::no_limit : p.ConsumeFloatingPointInRange<double>(0.1, 50.0);
    cfg.kl_coef = p.ConsumeBool() ? 0.0 : p.ConsumeFloatingPointInRange<double>(-10.0, 10.0);
    cfg.entropy_coef = p.ConsumeBool() ? 0.0 : p.ConsumeFloatingPointInRange<double>(-10.0, 10.0);
    cfg.normalizer.denominator = p.ConsumeFloatingPointInRange<double>(1e-3, 1e4);
    cfg.normalizer.scale = p.ConsumeFloatingPointInRange<double>(-10.0, 10.0);
  } else {
    for (double* x : {&o.eps_low, &o.eps_high, &o.dual_clip, &o.delta, &o.log_ratio_clamp, &o.gspo.seq_log_ratio_max,
                      &o.sapo.tau_pos, &o.sapo.tau_neg, &cfg.kl.input_clamp, &cfg.kl.output_clamp, &cfg.kl_coef,
                      &cfg.entropy_coef, &cfg.normalizer.denominator, &cfg.normalizer.scale})
      if (p.ConsumeBool()) *x = fuzz::any_double(p);
  }

  const bool with_ref = cfg.kl_coef != 0.0 ? p.ConsumeIntegralInRange<int>(0, 15) != 0 : p.ConsumeBool();
  const bool with_w = p.ConsumeBool();
  const bool with_ent = cfg.entropy_coef != 0.0 ? p.ConsumeIntegralInRange<int>(0, 15) != 0 : p.ConsumeBool();
  const bool with_gent = with_ent && p.ConsumeIntegralInRange<int>(0, 15) != 0;
  auto lp = make_array<T>(s, p, true), old = make_array<T>(s, p, true), adv = make_array<T>(s, p, true),
       mask = make_array<T>(s, p, true), ref = make_array<T>(s, p, with_ref), w = make_array<T>(s, p, with_w),
       ent = make_array<T>(s, p, with_ent), glp = make_array<T>(s, p, true), gent = make_array<T>(s, p, with_gent);
  fill(lp, p, moderate, -20.0, 0.0);
  fill(old, p, moderate, -20.0, 0.0);
  fill(adv, p, moderate, -10.0, 10.0);
  fill(ref, p, moderate, -20.0, 0.0);
  fill(w, p, moderate, 0.0, 4.0);
  fill(ent, p, moderate, 0.0, 10.0);
  bool binary = true;
  for (const auto i : mask.addr) {
    const int m = p.ConsumeIntegralInRange<int>(0, moderate ? 1 : 5);
    mask.buf[i] = m <= 1 ? T(m) : static_cast<T>(fuzz::any_double(p));
    binary = binary && (mask.buf[i] == T(0) || mask.buf[i] == T(1));
  }

  ulorl::policy_loss_inputs<T> in{lp.view, old.view, adv.view, mask.view, ref.view, w.view, ent.view};
  ulorl::policy_loss_result res;
  bool threw = false, cleared = false;
  try {
    res = ulorl::policy_loss(in, glp.view, gent.view, cfg);
  } catch (const ulorl::error& e) {
    threw = true;
    cleared = std::string_view(e.what()).find("the gradient outputs are set to 0") != std::string_view::npos;
  }
  // Outside the views nothing is written.
  const auto gaps_untouched = [](const array<T>& a) {
    std::vector<bool> in_view(a.buf.size(), false);
    for (const auto i : a.addr) in_view[i] = true;
    for (std::size_t i = 0; i < a.buf.size(); ++i)
      if (!in_view[i] && !fuzz::same_bits(a.buf[i], T(sentinel))) return false;
    return true;
  };
  const auto zero_in_view = [](const array<T>& a) {
    for (const auto i : a.addr)
      if (!fuzz::same_bits(a.buf[i], T(0))) return false;
    return true;
  };
  if (threw && !cleared) FUZZ_CHECK(untouched(glp) && untouched(gent));  // refused before the pass
  if (threw && cleared) {
    // A result out of its type's range is found after the pass, which wrote the gradients: the
    // error says so, and every gradient element in the views is then 0 (grad_entropy is written
    // only with an entropy term).
    FUZZ_CHECK(cfg.check_values);
    FUZZ_CHECK(gaps_untouched(glp) && gaps_untouched(gent) && zero_in_view(glp));
    FUZZ_CHECK(zero_in_view(gent) || (cfg.entropy_coef == 0.0 && untouched(gent)));
  }
  if (threw) return;
  // A value no enum names must be rejected, never run as some default (conventions: dispatch is loud).
  FUZZ_CHECK(kind < named(ulorl::objective_names));
  FUZZ_CHECK(estimator < named(ulorl::kl_estimator_names));
  FUZZ_CHECK(mode < named(ulorl::agg_mode_names));
  FUZZ_CHECK(seq_grad < named(ulorl::sequence_gradient_names));
  FUZZ_CHECK(gaps_untouched(glp) && gaps_untouched(gent));
  if (cfg.entropy_coef == 0.0) FUZZ_CHECK(untouched(gent));  // no entropy term: grad_entropy is not written
  if (!binary && !cfg.check_values) return;  // any non-zero mask value then counts as valid: nothing to compare
  // Counts from the mask, and a zero gradient wherever the mask is 0.
  double tokens = 0, sequences = 0;
  std::size_t k = 0;
  for (std::size_t b = 0; b < s.rows; ++b) {
    const std::size_t n = s.packed ? static_cast<std::size_t>(s.off64[b + 1] - s.off64[b]) : s.cols;
    double valid = 0;
    for (std::size_t t = 0; t < n; ++t, ++k) {
      const bool on = mask.buf[mask.addr[k]] != T(0);
      valid += on;
      if (!on) {
        FUZZ_CHECK(glp.buf[glp.addr[k]] == T(0));
        if (with_gent && cfg.entropy_coef != 0.0) FUZZ_CHECK(gent.buf[gent.addr[k]] == T(0));
      }
    }
    tokens += valid;
    sequences += valid > 0;
  }
  FUZZ_CHECK(res.metrics.tokens == tokens && res.metrics.sequences == sequences &&
             res.metrics.rows == static_cast<double>(s.rows));
  FUZZ_CHECK(res.metrics.clipped >= 0 && res.metrics.clipped <= tokens);
  if (tokens == 0) FUZZ_CHECK(res.loss == 0.0 && res.pg_loss == 0.0);
  if (cfg.kl_coef == 0.0) FUZZ_CHECK(res.kl_loss == 0.0);
  if (cfg.entropy_coef == 0.0) FUZZ_CHECK(res.entropy_loss == 0.0);
  if (moderate && moderate_cfg && cfg.check_values) {
    FUZZ_CHECK(std::isfinite(res.loss) && std::isfinite(res.pg_loss) && std::isfinite(res.kl_loss) &&
               std::isfinite(res.entropy_loss));
    for (const auto i : glp.addr) FUZZ_CHECK(std::isfinite(glp.buf[i]));
    for (const auto i : gent.addr) FUZZ_CHECK(std::isfinite(gent.buf[i]));
    if (tokens > 0) FUZZ_CHECK(res.metrics.ratio_min > 0.0 && res.metrics.ratio_min <= res.metrics.ratio_max);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider p(data, size);
  if (p.ConsumeBool())
    run<double>(p);
  else
    run<float>(p);
  return 0;
}
