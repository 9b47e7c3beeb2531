// ulorl/logits/backward.hpp — d loss / d logits from the statistics saved by logits_forward, in one
// read of the logits and one write of the gradient (no [N, V] temporary, may run in place).
// For L = sum_i g_lp_i log_prob_i + g_ent_i entropy_i (the per-row gradients any loss hands back):
//   dL/dx_ij = (g_lp_i (delta_{j,y_i} - p_ij) - g_ent_i p_ij (z_ij - E_i)) / tau,
//   p_ij = exp(z_ij - lse_i),  z_ij - E_i = log p_ij + entropy_i
// (verl's entropy/log_prob backward, golden README section 4.6; Liger's fused cross-entropy backward).
// The chosen token's element is evaluated in double with expm1, so g (1 - p) keeps its digits when
// p -> 1. Masked (-inf) logits get exactly 0 (and g_lp / tau if they are the label).
// log p_ij = (x_ij - c_i) / tau - r_i with the anchor of online_softmax.hpp: from the saved lse while
// it can place log p (anchor_of_lse), else from the row's own maximum and sum (anchor_of_row: one
// more read of that row), so a tiny or huge temperature costs no digits.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/isa_dispatch.hpp"
#include "ulorl/core/views.hpp"
#include "ulorl/logits/bf16.hpp"
#include "ulorl/logits/f16.hpp"
#include "ulorl/logits/forward.hpp"
#include "ulorl/logits/online_softmax.hpp"
#include "ulorl/core/parallel.hpp"
#include "ulorl/logits/simd.hpp"

ULORL_NAMESPACE_BEGIN

namespace detail::logits {
inline namespace ULORL_ISA {

inline void chunk_grad(const double* p, double* out, std::size_t n, double c, double inv_tau, double r, double a,
                       double b, bool, bool, const char*, std::size_t) noexcept {
  // p (a + b lp) as p a + (p lp) b, and 0 where p underflows (lp < -746, masked -inf included): a
  // huge b times a very negative lp cannot make inf * 0 = NaN where the gradient is 0 or tiny.
  for (std::size_t i = 0; i < n; ++i) {
    const double lp = (p[i] - c) * inv_tau - r;
    if (lp < -746.0) {
      out[i] = 0.0;
      continue;
    }
    const double e = std::exp(lp);
    out[i] = e * a + (e * lp) * b;
  }
}
inline void chunk_grad(const float* p, float* out, std::size_t n, double c, double inv_tau, double r, double a,
                       double b, bool fast, bool stream, const char* next, std::size_t next_bytes) noexcept {
  const auto af = static_cast<float>(a), bf = static_cast<float>(b);
  if (fast)
    simd::chunk_grad<false>(p, out, n, c, inv_tau, r, af, bf, stream, next, next_bytes);
  else
    simd::chunk_grad<true>(p, out, n, c, inv_tau, r, af, bf, stream, next, next_bytes);
}

//! Rows at least this long are written with non-temporal stores (they outgrow the caches anyway).
inline constexpr std::size_t stream_min_cols = 16384;

//! The anchor of a row whose saved lse cannot place log p: its own maximum and sum (one more read
//! of the row). Out of line: it is the rare path, and inlined it would crowd row_backward's loop.
template <class L>
ULORL_NOINLINE log_softmax_anchor<double> anchor_from_row(vector_view<const L> row, std::size_t label,
                                                          double inv_tau) noexcept {
  softmax_partial<double> st;
  (void)row_forward<L>(row, label, inv_tau, nullptr, nullptr, &st);
  return anchor_of_row(st);
}

//! One row. S: the type the statistics were stored in (it bounds what `lse` can place).
template <class S, class L, class G>
void row_backward(vector_view<const L> row, vector_view<G> out, std::size_t label, double lse, double entropy,
                  double g_lp, double g_ent, double tau, bool fast) noexcept {
  using C = compute_t<L>;
  alignas(64) C xbuf[chunk];
  alignas(64) C gbuf[chunk];
  const double inv_tau = 1.0 / tau;
  const grad_coeffs<double> k = backward_coeffs(g_lp, g_ent, entropy, inv_tau);
  // log p_j = (x_j - c) / tau - r. The anchor c = lse * tau rounded to C keeps x_j - c exact for
  // x_j near the row maximum, so large logit offsets (1e4) cost no digits in C arithmetic, while
  // |lse| is small enough for the stored lse to place log p; past that (a tiny temperature, huge
  // logits) or when lse * tau overflows C, the row's own maximum and sum (one more read of the row)
  // give c = max and r = log sum e^{(x_j - max) / tau}, as torch's log_softmax does.
  bool lse_ok = false;
  log_softmax_anchor<double> an = anchor_of_lse<S, C>(lse, tau, inv_tau, lse_ok);
  if (!lse_ok) [[unlikely]]
    an = anchor_from_row(row, label, inv_tau);
  const double c = an.c, r = an.r;
  // Read before the row is (possibly, in place) overwritten.
  const double x_label = static_cast<double>(widen(row[label]));
  const double g_label = label_gradient((x_label - c) * inv_tau - r, g_lp, g_ent, entropy, inv_tau);
  const std::size_t v = row.size();
  for (std::size_t j0 = 0; j0 < v; j0 += chunk) {
    const std::size_t n = v - j0 < chunk ? v - j0 : chunk;
    const C* x = load_chunk<L>(row, j0, n, xbuf);
    constexpr bool direct_ok = std::is_same_v<G, C>;
    C* o = gbuf;
    if constexpr (direct_ok) {
      if (out.stride() == 1) o = out.data() + j0;
    }
    const bool stream = o != gbuf && v >= stream_min_cols;
    const auto [next, next_bytes] = next_chunk(row, j0);
    chunk_grad(x, o, n, c, inv_tau, r, k.a, k.b, fast, stream, next, next_bytes);
    if (label >= j0 && label < j0 + n) o[label - j0] = static_cast<C>(g_label);
    if (o == gbuf) {
      G* dst = out.data() + static_cast<std::ptrdiff_t>(j0) * out.stride();
      if constexpr (is_half_v<G> && std::is_same_v<C, float>) {
        if (out.stride() == 1) {
          if constexpr (std::is_same_v<G, bf16>)
            float_to_bf16(gbuf, dst, n);
          else
            float_to_f16(gbuf, dst, n);
          continue;
        }
      }
      for (std::size_t i = 0; i < n; ++i) dst[static_cast<std::ptrdiff_t>(i) * out.stride()] = narrow<G>(gbuf[i]);
    }
  }
  if (v >= stream_min_cols) simd::fence_streams();
}

template <class S>
void require_stat(const char* fn, const char* arg, vector_view<const S> v, std::size_t rows) {
  require_same_size(fn, arg, v.size(), "logits rows", rows);
  require_pointer(fn, arg, v.data(), v.size());
  for (std::size_t r = 0; r < v.size(); ++r)
    if (!std::isfinite(static_cast<double>(v[r])))
      detail::fail_at(fn, arg, static_cast<std::int64_t>(r), static_cast<double>(v[r]),
                      "must be finite (row " + std::to_string(r) + ")");
}

}  // namespace ULORL_ISA
}  // namespace detail::logits

namespace detail {
inline namespace ULORL_ISA {
//! logits_backward's body: validation and the rows. It depends on the element types only (the
//! executor is referenced), so a translation unit built with other instruction-set flags can
//! compile it for install_kernel (core/isa_dispatch.hpp).
template <class L, class I, class S, class D, class G>
void logits_backward_dispatch(matrix_view<const L> logits, std::span<const I> labels, vector_view<const S> lse,
                              vector_view<const S> entropy, vector_view<const D> grad_log_prob,
                              vector_view<const D> grad_entropy, matrix_view<G> grad_logits, const logits_config& cfg,
                              executor_ref exec) {
  static_assert(std::is_floating_point_v<S> && std::is_floating_point_v<D>, "statistics are float or double");
  static_assert(detail::logits::is_storage_v<G>, "grad_logits must be float, double, ulorl::bf16 or ulorl::f16");
  constexpr const char* fn = "logits_backward";
  detail::logits::validate_common<S>(fn, logits, labels, cfg);
  if (cfg.check_values) detail::logits::require_logits<detail::logits::range_t<L, S>>(fn, logits, cfg.temperature);
  const std::size_t n = logits.rows();
  const bool with_entropy = grad_entropy.size() != 0;
  detail::logits::require_stat(fn, "lse", lse, n);
  detail::logits::require_stat(fn, "grad_log_prob", grad_log_prob, n);
  if (with_entropy) {
    detail::logits::require_stat(fn, "grad_entropy", grad_entropy, n);
    detail::logits::require_stat(fn, "entropy", entropy, n);
  }
  if (grad_logits.rows() != logits.rows() || grad_logits.cols() != logits.cols())
    detail::fail(fn, "grad_logits",
                 "has shape [" + std::to_string(grad_logits.rows()) + ", " + std::to_string(grad_logits.cols()) +
                     "] but 'logits' has [" + std::to_string(logits.rows()) + ", " + std::to_string(logits.cols()) + "]");
  detail::logits::require_pointer(fn, "grad_logits", grad_logits.data(), grad_logits.size());
  require_distinct_elements(fn, "grad_logits", grad_logits);
  const double tau = cfg.temperature;
  exec(n, [&](std::size_t begin, std::size_t end) {
    for (std::size_t r = begin; r < end; ++r) {
      const double g_ent = with_entropy ? static_cast<double>(grad_entropy[r]) : 0.0;
      const double h = with_entropy ? static_cast<double>(entropy[r]) : 0.0;
      detail::logits::row_backward<S, L, G>(logits.row(r), grad_logits.row(r), static_cast<std::size_t>(labels[r]),
                                         static_cast<double>(lse[r]), h, static_cast<double>(grad_log_prob[r]), g_ent,
                                         tau, cfg.fast_backward);
    }
  });
}
}  // namespace ULORL_ISA
}  // namespace detail

//! The run-time instruction-set dispatch of logits_backward (core/isa_dispatch.hpp): its body for
//! logits L, labels I, statistics S, row gradients D and logits gradient G is
//! detail::logits_backward_dispatch<L, I, S, D, G> of one instruction set. Installed, it runs every
//! logits_backward of the program, policy_loss_from_logits's and the torch adapter's included.
struct isa_op::logits_backward {
  template <class... A>
  struct kernel;
  template <class L, class I, class S, class D, class G>
  struct kernel<L, I, S, D, G> {
    using type = void (*)(matrix_view<const L>, std::span<const I>, vector_view<const S>, vector_view<const S>,
                          vector_view<const D>, vector_view<const D>, matrix_view<G>, const logits_config&,
                          executor_ref);
  };
};

inline namespace ULORL_ISA {

//! Writes dL/dlogits for L = sum_i grad_log_prob_i log_prob_i + grad_entropy_i entropy_i.
//! `lse`, `entropy` [N]: saved by logits_forward with the same logits and temperature.
//! `grad_log_prob` [N]; `grad_entropy` [N] or empty (no entropy term; `entropy` may then be empty).
//! `grad_logits` [N, V] (float, double, bf16 or f16; any non-overlapping strides) may be the logits
//! buffer itself (same type and strides): the backward then runs in place.
//! Throws ulorl::error before writing anything (non-finite statistics or gradients name their row).
//! Runs the kernel installed for (L, I, S, D, G), if any (core/isa_dispatch.hpp), else this
//! translation unit's.
template <class L, class I, class S, class D, class G, class Exec = sequential_executor>
void logits_backward(matrix_view<const L> logits, std::span<const I> labels, vector_view<const S> lse,
                     vector_view<const S> entropy, vector_view<const D> grad_log_prob,
                     vector_view<const D> grad_entropy, matrix_view<G> grad_logits, const logits_config& cfg = {},
                     Exec&& exec = {}) {
  static_assert(std::is_floating_point_v<S> && std::is_floating_point_v<D>, "statistics are float or double");
  static_assert(detail::logits::is_storage_v<G>, "grad_logits must be float, double, ulorl::bf16 or ulorl::f16");
  if (const auto k = installed_kernel<isa_op::logits_backward, L, I, S, D, G>()) [[unlikely]]
    return k(logits, labels, lse, entropy, grad_log_prob, grad_entropy, grad_logits, cfg, executor_ref(exec));
  detail::logits_backward_dispatch<L, I, S, D, G>(logits, labels, lse, entropy, grad_log_prob, grad_entropy, grad_logits,
                                                  cfg, executor_ref(exec));
}

//! Convenience overload for mutable logits views (e.g. in place: grad_logits == logits).
template <class L, class I, class S, class D, class G, class Exec = sequential_executor>
  requires(!std::is_const_v<L>)
void logits_backward(matrix_view<L> logits, std::span<const I> labels, vector_view<const S> lse,
                     vector_view<const S> entropy, vector_view<const D> grad_log_prob,
                     vector_view<const D> grad_entropy, matrix_view<G> grad_logits, const logits_config& cfg = {},
                     Exec&& exec = {}) {
  logits_backward(matrix_view<const L>(logits), labels, lse, entropy, grad_log_prob, grad_entropy, grad_logits, cfg,
                  std::forward<Exec>(exec));
}

}  // namespace ULORL_ISA

ULORL_NAMESPACE_END
