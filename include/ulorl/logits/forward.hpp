// ulorl/logits/forward.hpp — per-row statistics of logits [N, V] in ONE pass over memory: the chosen
// token's log-prob, the entropy and the log-sum-exp, for float, double, bf16 or f16 storage, any strides,
// optional temperature (z = logits / tau, as verl's `logits.div_(temperature)`).
//   log_prob_i = z[i, y_i] - lse_i,   entropy_i = lse_i - sum_j p_ij z_ij,   lse_i = log sum_j e^{z_ij}
// Online softmax (Milakov & Gimelshein 2018) extended with the running sum of e^d d, so the entropy
// needs no second pass: see online_softmax.hpp. Never materialises an [N, V] temporary; the scratch is
// one 1024-element chunk on the stack. Matches verl `logprobs_from_logits` + `entropy_from_logits`
// (golden op `logits_stats`), torch `log_softmax(z).gather(y)` and `-(softmax(z) * log_softmax(z)).sum()`.
//
// Non-finite logits: -inf marks masked vocabulary (probability exactly 0, no contribution to the
// entropy). The value scan (`check_values`, on by default as in every area of ulorl) rejects NaN or
// +inf logits, all -inf rows and rows whose scaled logits would overflow before anything is
// written. The forward scans inside its own read (one integer maximum per logit in the loop that
// takes each chunk's maximum; the statistics wait in an [N] scratch array until every row has
// passed); logits_backward, which writes [N, V], scans in a read of its own first. With
// `check_values = false` a NaN or +inf makes its row's outputs NaN (other rows are unaffected), as
// torch does.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/isa_dispatch.hpp"
#include "ulorl/core/views.hpp"
#include "ulorl/logits/bf16.hpp"
#include "ulorl/logits/f16.hpp"
#include "ulorl/logits/online_softmax.hpp"
#include "ulorl/core/parallel.hpp"
#include "ulorl/logits/simd.hpp"

ULORL_NAMESPACE_BEGIN

//! Options shared by logits_forward and logits_backward.
struct logits_config {
  //! z = logits / temperature; finite, > 0, with 1 / temperature finite in the arithmetic type
  //! (float for float, bf16 and f16 logits, double for double)
  double temperature = 1.0;
  //! The value scan: reject NaN / +inf logits, all -inf rows, rows whose logits max |x| exceed half
  //! the range of their arithmetic type and rows whose scaled logits max |x| / temperature exceed
  //! half the range of the statistics' type, before writing anything
  //! (logits_forward and policy_loss_from_logits: inside the forward's read of the logits;
  //! logits_backward: one extra read). false: such rows give NaN / inf statistics instead.
  bool check_values = true;
  //! Backward only: form log p in float as torch does (p off by |log p| * 6e-8 relative, e.g. 1e-6
  //! at p = 1e-7) instead of double; about half the arithmetic, for when that bounds the speed.
  bool fast_backward = false;
};

namespace detail::logits {
inline namespace ULORL_ISA {

inline constexpr std::size_t chunk = 1024;  // 4 KiB of float: two L1-resident reads per chunk

template <class L>
inline constexpr bool is_half_v = std::is_same_v<L, bf16> || std::is_same_v<L, f16>;
template <class L>
inline constexpr bool is_storage_v = std::is_same_v<L, float> || std::is_same_v<L, double> || is_half_v<L>;
//! Arithmetic type for a storage type: float for float, bf16 and f16, double for double.
template <class L>
using compute_t = std::conditional_t<std::is_same_v<L, double>, double, float>;

template <class L>
ULORL_ALWAYS_INLINE compute_t<L> widen(L v) noexcept {
  if constexpr (is_half_v<L>)
    return v.to_float();
  else
    return v;
}
template <class G, class C>
ULORL_ALWAYS_INLINE G narrow(C v) noexcept {
  if constexpr (is_half_v<G>)
    return G::from_float(static_cast<float>(v));
  else
    return static_cast<G>(v);
}

//! Elements [j0, j0 + n) of a row as contiguous compute-type values: the row itself when it already
//! is, else widened / gathered into `buf`.
template <class L, class C = compute_t<L>>
ULORL_ALWAYS_INLINE const C* load_chunk(vector_view<const L> row, std::size_t j0, std::size_t n, C* buf) noexcept {
  const std::ptrdiff_t st = row.stride();
  const L* p = row.data() + static_cast<std::ptrdiff_t>(j0) * st;
  if constexpr (std::is_same_v<L, C>) {
    if (st == 1) return p;
    for (std::size_t i = 0; i < n; ++i) buf[i] = p[static_cast<std::ptrdiff_t>(i) * st];
  } else if constexpr (is_half_v<L>) {
    if (st == 1) {
      if constexpr (std::is_same_v<L, bf16>)
        bf16_to_float(p, buf, n);
      else
        f16_to_float(p, buf, n);
    } else {
      for (std::size_t i = 0; i < n; ++i) buf[i] = p[static_cast<std::ptrdiff_t>(i) * st].to_float();
    }
  }
  return buf;
}

//! The chunk maximum (NaN ignored); with Scan, *hi also rises to the largest |x| bits of the chunk
//! (simd::max_abs_bits) in the same loop.
template <bool Scan>
inline double chunk_max(const double* p, std::size_t n, std::uint64_t* hi) noexcept {
  double m = -std::numeric_limits<double>::infinity();
  std::uint64_t h = 0;
  for (std::size_t i = 0; i < n; ++i) {
    m = p[i] > m ? p[i] : m;
    if constexpr (Scan) {
      const std::uint64_t b = ulorl::detail::bit_cast<std::uint64_t>(p[i]) & 0x7fffffffffffffffull;
      h = b > h ? b : h;
    }
  }
  if constexpr (Scan) *hi = h > *hi ? h : *hi;
  return m;
}
template <bool Scan>
inline float chunk_max(const float* p, std::size_t n, std::uint32_t* hi) noexcept {
  return simd::chunk_max<Scan>(p, n, hi);
}

//! s += sum_j e^{d_j}, t += sum_j e^{d_j} d_j and, with Sq, q += sum_j e^{2 d_j}, d_j = (x_j - m) / tau.
template <bool Sq>
inline void chunk_sums(const double* p, std::size_t n, double m, double inv_tau, double& s, double& t, double& q,
                       const char*, std::size_t) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const double d = (p[i] - m) * inv_tau;
    if (d == -std::numeric_limits<double>::infinity()) continue;
    const double e = std::exp(d);
    s += e;
    t += e * d;
    if constexpr (Sq) q += e * e;
  }
}
template <bool Sq>
inline void chunk_sums(const float* p, std::size_t n, double m, double inv_tau, double& s, double& t, double& q,
                       const char* next = nullptr, std::size_t next_bytes = 0) noexcept {
  simd::chunk_sums<Sq>(p, n, static_cast<float>(m), simd::positive_scale(inv_tau), s, t, q, next, next_bytes);
}

//! Storage of the chunk after [j0, j0 + chunk) of a contiguous row, for prefetching (else null).
template <class L>
ULORL_ALWAYS_INLINE std::pair<const char*, std::size_t> next_chunk(vector_view<const L> row, std::size_t j0) noexcept {
  const std::size_t b = j0 + chunk;
  if (row.stride() != 1 || b >= row.size()) return {nullptr, 0};
  const std::size_t n = row.size() - b < chunk ? row.size() - b : chunk;
  return {reinterpret_cast<const char*>(row.data() + b), n * sizeof(L)};
}

template <class C>
bool has_nan(const C* p, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != p[i]) return true;
  return false;
}

//! One row: one pass over memory (each chunk is read from memory once, then from L1). With Sq,
//! `*sum_pi_squared` receives sum_j p_j^2 = (sum_j e^{2 d_j}) / s^2, accumulated relative to the same
//! running maximum as s (rescaled by e^{2 delta}). With Scan, `*max_abs` receives the largest |x|
//! bits of the row's values in the arithmetic type (simd::max_abs_bits), found in the loop that
//! takes each chunk's maximum: the value scan without a read of its own. `state`, when given,
//! receives the row's online-softmax state (its maximum and sums; the backward's anchor_of_row).
template <class L, bool Sq = false, bool Scan = false>
token_stats<double> row_forward(vector_view<const L> row, std::size_t label, double inv_tau,
                                double* sum_pi_squared = nullptr,
                                simd::uint_of_t<compute_t<L>>* max_abs = nullptr,
                                softmax_partial<double>* state = nullptr) noexcept {
  using C = compute_t<L>;
  simd::uint_of_t<C> hi = 0;
  alignas(64) C buf[chunk];
  softmax_partial<double> st;
  double sq = 0;  // sum_j e^{2 d_j} relative to st.max (Sq only)
  bool nan = false;
  const std::size_t v = row.size();
  for (std::size_t j0 = 0; j0 < v; j0 += chunk) {
    const std::size_t n = v - j0 < chunk ? v - j0 : chunk;
    const C* x = load_chunk<L>(row, j0, n, buf);
    const C cm = chunk_max<Scan>(x, n, &hi);
    if (!(cm > -std::numeric_limits<C>::infinity())) {  // only -inf (masked) and NaN in this chunk
      nan = nan || has_nan(x, n);
      continue;
    }
    if (static_cast<double>(cm) > st.max) {
      if constexpr (Sq)
        if (sq != 0) sq *= std::exp(2 * (st.max - static_cast<double>(cm)) * inv_tau);
      st = st.rescaled(static_cast<double>(cm), inv_tau);
    }
    double s = 0, t = 0, q = 0;
    const auto [next, next_bytes] = next_chunk(row, j0);
    chunk_sums<Sq>(x, n, st.max, inv_tau, s, t, q, next, next_bytes);
    st.sum += s;
    st.tsum += t;
    if constexpr (Sq) sq += q;
  }
  if constexpr (Scan) *max_abs = hi;
  if (state != nullptr) *state = st;
  if (nan) {
    const double q = std::numeric_limits<double>::quiet_NaN();
    if constexpr (Sq) *sum_pi_squared = q;
    return {q, q, q};
  }
  if constexpr (Sq)
    *sum_pi_squared = st.max == -std::numeric_limits<double>::infinity() ? std::numeric_limits<double>::quiet_NaN()
                                                                          : sq / (st.sum * st.sum);
  return finalize(st, static_cast<double>(widen(row[label])), inv_tau);
}

template <class C>
constexpr const char* type_name() noexcept {
  return std::is_same_v<C, float> ? "float" : "double";
}

//! The temperature rule of every entry point that takes one (logits_forward, logits_backward,
//! policy_loss_from_logits, the linear head): finite, > 0, and with a reciprocal that is finite in
//! the kernel's arithmetic type C (float for float, bf16 and f16 logits: temperature >= ~2.9e-39; double:
//! temperature >= ~5.6e-309). A subnormal temperature such as 1e-320 has 1 / t = inf, which makes
//! every scaled logit +-inf or NaN.
template <class C>
void require_temperature(const char* fn, double temperature) {
  require_divisor<C>(fn, "temperature", temperature);  // else every scaled logit would be +-inf or NaN
}

//! With value checking on, the scaled logits of a row must stay within half the range of R (the
//! narrower of the arithmetic and the statistics type): max_j |x_j| / temperature <= max(R) / 2
//! over the finite x_j. Then every scaled logit z_j, every difference z_j - z_k (the log-probs and
//! the exponents of the softmax) and lse = max z + log sum e^(z - max z) <= max z + log V are
//! finite, so no statistic can be a silent inf or NaN.
template <class R>
[[nodiscard]] bool scaled_in_range(double x, double inv_tau) noexcept {
  return std::fabs(x) * inv_tau <= static_cast<double>(std::numeric_limits<R>::max()) / 2;
}
template <class R>
void require_scaled_row(const char* fn, std::size_t row, std::size_t cols, std::size_t col, double x, double inv_tau,
                      double temperature) {
  const double limit = static_cast<double>(std::numeric_limits<R>::max()) / 2;
  if (scaled_in_range<R>(x, inv_tau)) return;
  std::ostringstream os;
  os.precision(17);
  os << "row " << row << ": |logit| / temperature (temperature = " << temperature << ") exceeds half the range of "
     << type_name<R>() << " (" << limit << "), so its log-sum-exp or log-probs would overflow to inf";
  detail::fail_at(fn, "logits", static_cast<std::int64_t>(row * cols + col), x, os.str());
}

//! With value checking on, the logits themselves must stay within half the range of their
//! arithmetic type C: then every difference x_j - max x (the kernels' exponents, taken before the
//! division by the temperature) is finite. Float logits of +-3e38 at temperature 1e38 would
//! otherwise lose their row's smaller terms to a -inf difference.
template <class C>
[[nodiscard]] bool raw_in_range(double x) noexcept {
  return std::fabs(x) <= static_cast<double>(std::numeric_limits<C>::max()) / 2;
}

//! Whether a row whose largest |x| has the bits `hi` (simd::max_abs_bits over values of type V)
//! passes the value scan without a look at its elements: no inf or NaN, and in range.
template <class R, class V>
[[nodiscard]] bool row_passes(simd::uint_of_t<V> hi, double inv_tau) noexcept {
  const auto x = static_cast<double>(widen(ulorl::detail::bit_cast<V>(hi)));
  return hi < simd::inf_bits<V> && raw_in_range<compute_t<V>>(x) && scaled_in_range<R>(x, inv_tau);
}

//! The value scan of row r, element by element: NaN / +inf logits and an all -inf row are errors
//! (-inf marks a masked vocabulary entry), then the scaled row range of require_scaled_row; the
//! message names the first offending column.
template <class R, class L>
void require_logits_row(const char* fn, matrix_view<const L> logits, std::size_t r, double temperature) {
  const double inv_tau = 1.0 / temperature;
  bool any_finite = false;
  double biggest = 0;
  std::size_t at = 0;
  for (std::size_t c = 0; c < logits.cols(); ++c) {
    const double x = static_cast<double>(widen(logits(r, c)));
    if (std::isnan(x) || x == std::numeric_limits<double>::infinity())
      detail::fail_at(fn, "logits", static_cast<std::int64_t>(r * logits.cols() + c), x,
                      "must not be NaN or +inf (row " + std::to_string(r) + ", column " + std::to_string(c) +
                          "; -inf marks a masked vocabulary entry)");
    if (std::isfinite(x)) {
      any_finite = true;
      if (std::fabs(x) > biggest) biggest = std::fabs(x), at = c;
    }
  }
  if (!any_finite)
    detail::fail_at(fn, "logits", static_cast<std::int64_t>(r * logits.cols()), -std::numeric_limits<double>::infinity(),
                    "row " + std::to_string(r) + " has no finite logit (every entry is -inf)");
  using C = compute_t<L>;
  if (!raw_in_range<C>(biggest))
    detail::fail_at(fn, "logits", static_cast<std::int64_t>(r * logits.cols() + at), static_cast<double>(widen(logits(r, at))),
                    "row " + std::to_string(r) + ": |logit| exceeds half the range of " + type_name<C>() +
                        ", so differences of logits would overflow at any temperature");
  require_scaled_row<R>(fn, r, logits.cols(), at, static_cast<double>(widen(logits(r, at))), inv_tau, temperature);
}

//! The value scan of every row, before anything is written (require_logits_row's rules). A
//! unit-stride row takes one vectorised pass first (simd::max_abs_bits); only a row with a
//! non-finite entry or out of range, or a strided row, takes the element-wise loop.
template <class R, class L>
void require_logits(const char* fn, matrix_view<const L> logits, double temperature) {
  const double inv_tau = 1.0 / temperature;
  const bool unit = logits.col_stride() == 1 || logits.cols() == 1;
  for (std::size_t r = 0; r < logits.rows(); ++r) {
    if (unit && logits.cols() > 0 && row_passes<R, L>(simd::max_abs_bits(&logits(r, 0), logits.cols()), inv_tau))
      continue;
    require_logits_row<R>(fn, logits, r, temperature);
  }
}

template <class T>
void require_pointer(const char* fn, const char* arg, const T* p, std::size_t n) {
  if (n == 0) return;
  if (p == nullptr) detail::fail(fn, arg, "is null but has " + std::to_string(n) + " elements");
  if (reinterpret_cast<std::uintptr_t>(p) % alignof(T) != 0)
    detail::fail(fn, arg, "data pointer is not aligned to its element type (" + std::to_string(alignof(T)) + " bytes)");
}

//! The narrower of the arithmetic type of logits L and the statistics type S.
template <class L, class S>
using range_t = std::conditional_t<(sizeof(compute_t<L>) < sizeof(S)), compute_t<L>, S>;

//! Shape, pointers, labels and temperature: everything O(N) is checked before any output is written.
//! S is the statistics type (outputs of the forward, saved inputs of the backward). The value scan
//! (cfg.check_values) is the caller's: a separate pass (require_logits) or inside the forward's read.
template <class S, class L, class I>
void validate_common(const char* fn, matrix_view<const L> logits, std::span<const I> labels, const logits_config& cfg) {
  static_assert(is_storage_v<L>, "logits must be float, double, ulorl::bf16 or ulorl::f16");
  static_assert(std::is_integral_v<I>, "labels must be integers");
  static_assert(std::is_floating_point_v<S>, "statistics are float or double");
  require_temperature<compute_t<L>>(fn, cfg.temperature);
  if (logits.rows() > 0 && logits.cols() == 0) detail::fail(fn, "logits", "has V = 0 columns: no vocabulary");
  require_pointer(fn, "logits", logits.data(), logits.size());
  require_same_size(fn, "labels", labels.size(), "logits rows", logits.rows());
  const auto v = static_cast<std::uint64_t>(logits.cols());
  for (std::size_t r = 0; r < labels.size(); ++r) {
    const I y = labels[r];
    if (y < I(0) || static_cast<std::uint64_t>(y) >= v)
      detail::fail_at(fn, "labels", static_cast<std::int64_t>(r), static_cast<std::int64_t>(y),
                      "must be in [0, V) with V = " + std::to_string(v) + " (row " + std::to_string(r) + ")");
  }
}

template <class S>
void require_output(const char* fn, const char* arg, vector_view<S> out, std::size_t rows, bool optional) {
  if (optional && out.size() == 0) return;
  require_same_size(fn, arg, out.size(), "logits rows", rows);
  require_pointer(fn, arg, out.data(), out.size());
  require_distinct_elements(fn, arg, out);
}

}  // namespace ULORL_ISA
}  // namespace detail::logits

//! The per-row outputs of logits_forward, each [N] (float or double) or an empty view when not
//! wanted. `log_prob` is required. `entropy` and `lse` cost nothing extra; keep them for
//! logits_backward (store lse in double when |logits| is large: float lse is exact only to
//! |lse| * 6e-8, and past |lse| = 1024 the backward re-reads the row instead; see
//! lse_anchor_limit). `sum_pi_squared` is sum_v p_v^2 = exp(lse(2z) - 2 lse(z)) of the row (the
//! collision probability; the optimal token baseline's statistic, verl's `sum_pi_squared`), in the
//! same pass: one more multiply-add per logit, only when given.
template <class S>
struct logits_outputs {
  vector_view<S> log_prob;
  vector_view<S> entropy{};
  vector_view<S> lse{};
  vector_view<S> sum_pi_squared{};
};

namespace detail {
inline namespace ULORL_ISA {
//! logits_forward's body: validation and the rows. It depends on the element types only (the
//! executor is referenced, not a template parameter), so a translation unit built with other
//! instruction-set flags can compile it for install_kernel (core/isa_dispatch.hpp).
template <class L, class I, class S>
void logits_forward_dispatch(matrix_view<const L> logits, std::span<const I> labels, const logits_outputs<S>& out,
                             const logits_config& cfg, executor_ref exec) {
  static_assert(std::is_floating_point_v<S>, "statistics are float or double");
  constexpr const char* fn = "logits_forward";
  detail::logits::validate_common<S>(fn, logits, labels, cfg);
  const std::size_t n = logits.rows();
  // Named copies, not a structured binding: clang 14 cannot capture bindings in a lambda.
  const vector_view<S> log_prob = out.log_prob, entropy = out.entropy, lse = out.lse, sum_sq = out.sum_pi_squared;
  detail::logits::require_output(fn, "log_prob", log_prob, n, false);
  detail::logits::require_output(fn, "entropy", entropy, n, true);
  detail::logits::require_output(fn, "lse", lse, n, true);
  detail::logits::require_output(fn, "sum_pi_squared", sum_sq, n, true);
  require_disjoint(fn, "entropy", entropy, "log_prob", log_prob);
  require_disjoint(fn, "lse", lse, "log_prob", log_prob);
  require_disjoint(fn, "lse", lse, "entropy", entropy);
  require_disjoint(fn, "sum_pi_squared", sum_sq, "log_prob", log_prob);
  require_disjoint(fn, "sum_pi_squared", sum_sq, "entropy", entropy);
  require_disjoint(fn, "sum_pi_squared", sum_sq, "lse", lse);
  const double inv_tau = 1.0 / cfg.temperature;
  using C = detail::logits::compute_t<L>;
  using R = detail::logits::range_t<L, S>;
  // The statistics of one row into the outputs.
  const auto put = [&](std::size_t r, const token_stats<double>& st, double q) {
    log_prob[r] = static_cast<S>(st.log_prob);
    if (entropy.size() != 0) entropy[r] = static_cast<S>(st.entropy);
    if (lse.size() != 0) lse[r] = static_cast<S>(st.lse);
    if (sum_sq.size() != 0) sum_sq[r] = static_cast<S>(q);
  };
  // With the value scan, it runs inside the forward's own read: each row's statistics and largest
  // |x| go to a scratch array ([N], not [N, V]); rows whose maximum is not plainly in range
  // (non-finite entries, including the legal -inf of masked vocabulary, or too large) then take the
  // element-wise check in row order, which throws at the first offending one; only then are the
  // outputs written.
  struct row_result {
    token_stats<double> st;
    double q;
    bool passes;
  };
  std::vector<row_result> tmp(cfg.check_values ? n : 0);
  const auto rows = [&]<bool Sq, bool Scan>(std::size_t begin, std::size_t end) {
    for (std::size_t r = begin; r < end; ++r) {
      double q = 0;
      simd::uint_of_t<C> hi = 0;
      const auto st = detail::logits::row_forward<L, Sq, Scan>(logits.row(r), static_cast<std::size_t>(labels[r]),
                                                                inv_tau, &q, &hi);
      if constexpr (Scan)
        tmp[r] = {st, q, detail::logits::row_passes<R, C>(hi, inv_tau)};
      else
        put(r, st, q);
    }
  };
  const auto all_rows = [&]<bool Scan>() {
    if (sum_sq.size() != 0)
      exec(n, [&](std::size_t begin, std::size_t end) { rows.template operator()<true, Scan>(begin, end); });
    else
      exec(n, [&](std::size_t begin, std::size_t end) { rows.template operator()<false, Scan>(begin, end); });
  };
  if (!cfg.check_values) {
    all_rows.template operator()<false>();
    return;
  }
  all_rows.template operator()<true>();
  for (std::size_t r = 0; r < n; ++r)
    if (!tmp[r].passes) detail::logits::require_logits_row<R>(fn, logits, r, cfg.temperature);
  for (std::size_t r = 0; r < n; ++r) put(r, tmp[r].st, tmp[r].q);
}
}  // namespace ULORL_ISA
}  // namespace detail

//! The run-time instruction-set dispatch of logits_forward (core/isa_dispatch.hpp): its body for
//! (L, I, S) is detail::logits_forward_dispatch<L, I, S> of one instruction set. Installed, it runs
//! every logits_forward of the program, policy_loss_from_logits's and the torch adapter's included.
struct isa_op::logits_forward {
  template <class... A>
  struct kernel;
  template <class L, class I, class S>
  struct kernel<L, I, S> {
    using type = void (*)(matrix_view<const L>, std::span<const I>, const logits_outputs<S>&, const logits_config&,
                          executor_ref);
  };
};

inline namespace ULORL_ISA {

//! Per-row chosen-token log-prob, entropy, log-sum-exp and (optionally) sum of squared
//! probabilities of logits / temperature. `logits` [N, V] (float, double, bf16 or f16; any strides),
//! `labels` [N] in [0, V). `exec` runs rows in parallel (see parallel.hpp). Throws ulorl::error
//! before writing anything. Runs the kernel installed for (L, I, S), if any
//! (core/isa_dispatch.hpp), else this translation unit's.
template <class L, class I, class S, class Exec = sequential_executor>
void logits_forward(matrix_view<const L> logits, std::span<const I> labels, const logits_outputs<S>& out,
                    const logits_config& cfg = {}, Exec&& exec = {}) {
  static_assert(std::is_floating_point_v<S>, "statistics are float or double");
  if (const auto k = installed_kernel<isa_op::logits_forward, L, I, S>()) [[unlikely]]
    return k(logits, labels, out, cfg, executor_ref(exec));
  detail::logits_forward_dispatch<L, I, S>(logits, labels, out, cfg, executor_ref(exec));
}

//! Positional form: log_prob, entropy and lse (entropy and lse may be empty).
template <class L, class I, class S, class Exec = sequential_executor>
void logits_forward(matrix_view<const L> logits, std::span<const I> labels, vector_view<S> log_prob,
                    vector_view<S> entropy, vector_view<S> lse, const logits_config& cfg = {}, Exec&& exec = {}) {
  logits_forward(logits, labels, logits_outputs<S>{log_prob, entropy, lse}, cfg, std::forward<Exec>(exec));
}

//! Convenience overload for mutable logits views.
template <class L, class I, class S, class Exec = sequential_executor>
  requires(!std::is_const_v<L>)
void logits_forward(matrix_view<L> logits, std::span<const I> labels, vector_view<S> log_prob, vector_view<S> entropy,
                    vector_view<S> lse, const logits_config& cfg = {}, Exec&& exec = {}) {
  logits_forward(matrix_view<const L>(logits), labels, log_prob, entropy, lse, cfg, std::forward<Exec>(exec));
}
//! Convenience overload for mutable logits views.
template <class L, class I, class S, class Exec = sequential_executor>
  requires(!std::is_const_v<L>)
void logits_forward(matrix_view<L> logits, std::span<const I> labels, const logits_outputs<S>& out,
                    const logits_config& cfg = {}, Exec&& exec = {}) {
  logits_forward(matrix_view<const L>(logits), labels, out, cfg, std::forward<Exec>(exec));
}

}  // namespace ULORL_ISA

ULORL_NAMESPACE_END
