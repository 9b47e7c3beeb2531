// Fuzz target: logits_forward and logits_backward (ulorl/logits/) over fuzzed N, V, strides
// (positive, negative, broadcast, overlapping output), storage types (float, double), temperatures
// (tiny, huge, 0, negative, NaN), labels (out of range included) and logits (-inf masked entries,
// NaN, +inf, huge finite values), with and without the value scan (`check_values`). Each call either throws
// ulorl::error, and then no output element has changed, or returns; then, for rows whose logits
// are finite or -inf with at least one finite entry: log_prob <= 0, entropy in [0, log V], a
// finite lse, and a gradient whose row sums to ~0 (sum_j dL/dx_ij = g_lp (1 - sum p) / tau = 0)
// without NaN. Elements outside the output views stay untouched.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "fuzz_common.hpp"
#include "ulorl/logits.hpp"

namespace {

constexpr double sentinel = -777.5;

//! A [rows, cols] strided matrix in its own buffer; `base` is the offset of element (0, 0).
template <class T>
struct strided {
  std::vector<T> buf;
  std::ptrdiff_t rs = 0, cs = 1;
  std::size_t base = 0, rows = 0, cols = 0;
  ulorl::matrix_view<T> view() { return {buf.data() + base, rows, cols, rs, cs}; }
  std::size_t index(std::size_t r, std::size_t c) const {
    return static_cast<std::size_t>(static_cast<std::ptrdiff_t>(base) + static_cast<std::ptrdiff_t>(r) * rs +
                                    static_cast<std::ptrdiff_t>(c) * cs);
  }
};

template <class T>
strided<T> make(std::size_t rows, std::size_t cols, FuzzedDataProvider& p, bool allow_overlap) {
  strided<T> m;
  m.rows = rows;
  m.cols = cols;
  const int layout = p.ConsumeIntegralInRange<int>(0, allow_overlap ? 4 : 3);
  const auto c = static_cast<std::ptrdiff_t>(cols), r = static_cast<std::ptrdiff_t>(rows);
  switch (layout) {
    case 0: m.rs = c, m.cs = 1; break;                                          // row-major
    case 1: m.rs = c + p.ConsumeIntegralInRange<std::ptrdiff_t>(1, 5), m.cs = 1; break;  // padded rows
    case 2: m.rs = 1, m.cs = r; break;                                          // column-major
    case 3: m.rs = -c, m.cs = -1; break;                                        // reversed
    default: m.rs = p.ConsumeIntegralInRange<std::ptrdiff_t>(0, 2), m.cs = p.ConsumeIntegralInRange<std::ptrdiff_t>(0, 2); break;  // overlapping
  }
  if (rows == 0 || cols == 0) return m;
  std::ptrdiff_t lo = 0, hi = 0;
  for (const std::ptrdiff_t x : {(r - 1) * m.rs, std::ptrdiff_t{0}})
    for (const std::ptrdiff_t y : {(c - 1) * m.cs, std::ptrdiff_t{0}}) lo = std::min(lo, x + y), hi = std::max(hi, x + y);
  m.base = static_cast<std::size_t>(-lo);
  m.buf.assign(static_cast<std::size_t>(hi - lo + 1), T(sentinel));
  return m;
}

double logit(FuzzedDataProvider& p, bool wild) {
  if (!wild) return p.ConsumeIntegralInRange<int>(0, 15) == 0 ? -std::numeric_limits<double>::infinity()
                                                             : p.ConsumeFloatingPointInRange<double>(-30.0, 30.0);
  return fuzz::any_double(p);
}

template <class T>
bool same_buffer(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!fuzz::same_bits(a[i], b[i])) return false;
  return true;
}

template <class L, class S>
void run(FuzzedDataProvider& p) {
  const std::size_t n = p.ConsumeIntegralInRange<std::size_t>(0, 6);
  const std::size_t v = p.ConsumeIntegralInRange<int>(0, 15) == 0 ? p.ConsumeIntegralInRange<std::size_t>(1025, 3000)
                                                                 : p.ConsumeIntegralInRange<std::size_t>(0, 40);
  const bool wild = p.ConsumeIntegralInRange<int>(0, 3) == 0;
  ulorl::logits_config cfg;
  cfg.check_values = p.ConsumeBool();
  cfg.fast_backward = p.ConsumeBool();
  const bool moderate_tau = p.ConsumeBool();
  cfg.temperature = moderate_tau ? p.ConsumeFloatingPointInRange<double>(0.05, 20.0) : fuzz::any_double(p);

  auto x = make<L>(n, v, p, true);  // an input may overlap itself
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t c = 0; c < v; ++c) x.buf[x.index(r, c)] = static_cast<L>(logit(p, wild));
  std::vector<std::int64_t> labels(n);
  for (auto& y : labels)
    y = p.ConsumeIntegralInRange<int>(0, 15) == 0 ? fuzz::any_int64(p)
                                                 : p.ConsumeIntegralInRange<std::int64_t>(0, std::max<std::int64_t>(0, static_cast<std::int64_t>(v) - 1));
  if (n > 0 && p.ConsumeIntegralInRange<int>(0, 15) == 0) labels.pop_back();  // size mismatch

  // Outputs with a sentinel border: a unit or strided view into a larger buffer.
  const auto out_stride = static_cast<std::ptrdiff_t>(p.ConsumeIntegralInRange<int>(1, 3));
  std::vector<S> lp(n * static_cast<std::size_t>(out_stride) + 2, S(sentinel)), ent(lp), lse(lp);
  const auto vec = [&](std::vector<S>& b) { return ulorl::vector_view<S>(b.data() + 1, n, out_stride); };
  bool threw = false;
  try {
    ulorl::logits_forward(ulorl::matrix_view<const L>(x.view()), std::span<const std::int64_t>(labels), vec(lp), vec(ent), vec(lse), cfg);
  } catch (const ulorl::error&) {
    threw = true;
  }
  const std::vector<S> blank(lp.size(), S(sentinel));
  if (threw) {
    FUZZ_CHECK(same_buffer(lp, blank) && same_buffer(ent, blank) && same_buffer(lse, blank));
    return;
  }
  FUZZ_CHECK(labels.size() == n && std::isfinite(cfg.temperature) && cfg.temperature > 0);
  for (std::size_t i = 0; i < lp.size(); ++i)
    if (i == 0 || (i - 1) % static_cast<std::size_t>(out_stride) != 0 || i > n * static_cast<std::size_t>(out_stride))
      FUZZ_CHECK(fuzz::same_bits(lp[i], S(sentinel)) && fuzz::same_bits(ent[i], S(sentinel)) && fuzz::same_bits(lse[i], S(sentinel)));
  std::vector<bool> clean(n, true);  // finite or -inf logits with at least one finite entry
  const auto eps = std::is_same_v<S, float> || std::is_same_v<L, float> ? 1e-3 : 1e-9;
  for (std::size_t r = 0; r < n; ++r) {
    bool any = false;
    for (std::size_t c = 0; c < v; ++c) {
      const double z = static_cast<double>(x.buf[x.index(r, c)]);
      clean[r] = clean[r] && (std::isfinite(z) || z == -std::numeric_limits<double>::infinity());
      any = any || std::isfinite(z);
    }
    clean[r] = clean[r] && any && v > 0;
    if (cfg.check_values) FUZZ_CHECK(clean[r]);
    const auto at = static_cast<std::size_t>(1 + static_cast<std::ptrdiff_t>(r) * out_stride);
    if (!clean[r] || !moderate_tau || wild) continue;
    const double l = lp[at], h = ent[at], m = lse[at];
    FUZZ_CHECK(std::isfinite(m));
    FUZZ_CHECK(!std::isnan(l) && l <= eps * (1 + std::fabs(m)));
    FUZZ_CHECK(std::isfinite(h) && h >= -eps * (1 + std::fabs(m)) && h <= std::log(static_cast<double>(v)) + eps * (1 + std::fabs(m)));
  }

  // Backward from the forward's statistics (read back as contiguous arrays).
  std::vector<S> s_lse(n), s_ent(n);
  for (std::size_t r = 0; r < n; ++r) {
    const auto at = static_cast<std::size_t>(1 + static_cast<std::ptrdiff_t>(r) * out_stride);
    s_lse[r] = lse[at];
    s_ent[r] = ent[at];
  }
  std::vector<double> g_lp(n), g_ent(n);
  for (auto& g : g_lp) g = p.ConsumeBool() ? p.ConsumeFloatingPointInRange<double>(-2.0, 2.0) : fuzz::any_double(p);
  for (auto& g : g_ent) g = p.ConsumeBool() ? p.ConsumeFloatingPointInRange<double>(-2.0, 2.0) : fuzz::any_double(p);
  const bool with_entropy = p.ConsumeBool();
  auto g = make<L>(n, v, p, true);
  const auto before = g.buf;
  threw = false;
  try {
    ulorl::logits_backward(ulorl::matrix_view<const L>(x.view()), std::span<const std::int64_t>(labels),
                           ulorl::vector_view<const S>(s_lse.data(), n), ulorl::vector_view<const S>(s_ent.data(), n),
                           ulorl::vector_view<const double>(g_lp.data(), n),
                           with_entropy ? ulorl::vector_view<const double>(g_ent.data(), n) : ulorl::vector_view<const double>(),
                           g.view(), cfg);
  } catch (const ulorl::error&) {
    threw = true;
  }
  if (threw) {
    FUZZ_CHECK(same_buffer(g.buf, before));
    return;
  }
  // An output whose distinct elements share memory must have been rejected.
  if (n * v > 1) {
    std::vector<int> hits(g.buf.size(), 0);
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t c = 0; c < v; ++c) FUZZ_CHECK(++hits[g.index(r, c)] == 1);
  }
  if (!moderate_tau || wild) return;
  for (std::size_t r = 0; r < n; ++r) {
    if (!clean[r] || !std::isfinite(g_lp[r]) || std::fabs(g_lp[r]) > 2.0 || (with_entropy && std::fabs(g_ent[r]) > 2.0)) continue;
    double sum = 0, mag = 0;
    for (std::size_t c = 0; c < v; ++c) {
      const double d = static_cast<double>(g.buf[g.index(r, c)]);
      FUZZ_CHECK(std::isfinite(d));
      sum += d;
      mag += std::fabs(d);
    }
    FUZZ_CHECK(std::fabs(sum) <= 1e-2 * (1.0 + mag) + 1e-3 * static_cast<double>(v) / cfg.temperature);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider p(data, size);
  switch (p.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: run<float, float>(p); break;
    case 1: run<double, double>(p); break;
    default: run<float, double>(p); break;
  }
  return 0;
}
