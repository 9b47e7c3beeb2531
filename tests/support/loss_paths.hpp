// tests/support/loss_paths.hpp — one problem through policy_loss's two code paths: unit-stride
// rows (the explicit-SIMD kernel, whose width follows the including TU's -m flags) and the same
// data interleaved with junk at column stride 2 (the generic scalar loop over views). Used by
// test_loss_policy_loss (default flags, sanitised) and by the ISA probes of tests/isa/ (each built
// for its own instruction set). No Catch2 here: the probes must not run test code before the CPU
// check; the comparisons are in loss_compare.hpp.
#pragma once

#include <ulorl/loss/policy_loss.hpp>

#include <cstddef>
#include <memory>
#include <new>
#include <random>
#include <vector>

namespace loss_paths {

//! Row-major B x T problem in float64 (values representable in float, so that every element type
//! sees the same problem); every optional array filled.
struct problem {
  std::size_t B = 0, T = 0;
  std::vector<double> lp, old, adv, ref, w, ent, mask;
  //! The unit-stride run places its arrays `offset` elements past a 64-byte boundary (logp:
  //! `lp_offset`), so that rows start at every alignment the kernel's peel distinguishes.
  std::size_t offset = 0, lp_offset = 0;
};

//! Log-ratios mostly in (-0.8, 0.8) (every clip region), 3% beyond the +-20 clamp, 10% zero
//! advantages, 20% masked tokens, 1% masked tokens with a degenerate (0 - 0) ratio.
inline problem random_problem(std::mt19937_64& rng, std::size_t B, std::size_t Tn) {
  std::uniform_real_distribution<double> u(0, 1);
  problem p;
  p.B = B, p.T = Tn;
  const std::size_t n = B * Tn;
  for (auto* v : {&p.lp, &p.old, &p.adv, &p.ref, &p.w, &p.ent, &p.mask}) v->resize(n);
  const auto f = [](double x) { return static_cast<double>(static_cast<float>(x)); };
  for (std::size_t i = 0; i < n; ++i) {
    p.old[i] = f(-5 * u(rng));
    double x = (u(rng) - 0.5) * 1.6;
    if (u(rng) < 0.03) x = u(rng) < 0.5 ? -25 - u(rng) : 25 + u(rng);
    p.lp[i] = f(p.old[i] + x);
    p.adv[i] = u(rng) < 0.1 ? 0.0 : f((u(rng) - 0.5) * 4);
    p.ref[i] = f(p.lp[i] + (u(rng) - 0.5) * (u(rng) < 0.1 ? 6 : 0.6));
    p.w[i] = f(0.2 + 1.5 * u(rng));
    p.ent[i] = f(3 * u(rng));
    p.mask[i] = u(rng) < 0.8 ? 1 : 0;
    if (u(rng) < 0.01) p.mask[i] = 0, p.lp[i] = p.old[i] = 0;
  }
  return p;
}

struct run_result {
  ulorl::policy_loss_result res;
  std::vector<double> grad, grad_entropy;  //!< B x T (grad_entropy only with the entropy term)
  bool gaps_untouched = true;              //!< the run wrote nothing outside its tokens (strided: the
                                           //!< interleaved junk; unit stride: the guards around the rows)
};

struct paths {
  run_result fast;     //!< unit-stride rows: the vectorised kernel
  run_result generic;  //!< column stride 2: the scalar loop over views
};

// Internal linkage for everything that runs policy_loss or is called from an ISA probe: the probes
// include this header under different -m flags, and an external inline definition would be merged
// by the linker into one copy for all of them (the first object's: every probe would then run the
// default build's kernel).
namespace {

//! A heap array of E on a 64-byte boundary, of exactly `size` elements (so that the sanitisers see
//! a read past its end; std::vector<bool> has no data()).
template <class E>
struct buffer {
  using value_type = E;
  static constexpr std::align_val_t align{64};
  struct release {
    void operator()(E* q) const noexcept { ::operator delete[](q, align); }
  };
  std::unique_ptr<E[], release> p;
  std::size_t n = 0;
  buffer(std::size_t size, E fill) : p(new (align) E[size]), n(size) {
    for (std::size_t i = 0; i < n; ++i) p[i] = fill;
  }
  [[nodiscard]] E* data() { return p.get(); }
  [[nodiscard]] const E* data() const { return p.get(); }
  E& operator[](std::size_t i) { return p[i]; }
  const E& operator[](std::size_t i) const { return p[i]; }
};

//! Elements after the last token of an offset gradient buffer, which must keep their values.
inline constexpr std::size_t guard = 64;

//! `v` converted to E (a mask: 1 where non-zero), starting `offset` elements into the buffer.
template <class E>
buffer<E> converted(const std::vector<double>& v, bool as_mask = false, std::size_t offset = 0) {
  buffer<E> out(offset + v.size(), E{});
  for (std::size_t i = 0; i < v.size(); ++i) out[offset + i] = as_mask ? (v[i] != 0 ? E(1) : E(0)) : static_cast<E>(v[i]);
  return out;
}

//! Runs `cfg` on both paths. weights / entropy: pass the problem's arrays (the config's
//! entropy_coef must be non-zero for the entropy term).
template <class T, class M>
paths run_both(const problem& p, const ulorl::policy_loss_config& cfg, bool weights, bool entropy) {
  const std::size_t B = p.B, Tn = p.T, n = B * Tn;
  const auto spread = [n](const auto& v, auto junk, std::size_t off) {  // interleave with junk: v[off + i] at 2 i
    buffer<decltype(junk)> s(2 * n, junk);
    for (std::size_t i = 0; i < n; ++i) s[2 * i] = v[off + i];
    return s;
  };
  const std::size_t o = p.offset, olp = p.lp_offset, guards = o != 0 || olp != 0 ? guard : 0;
  const auto lp = converted<T>(p.lp, false, olp), old = converted<T>(p.old, false, o), adv = converted<T>(p.adv, false, o);
  const auto ref = converted<T>(p.ref, false, o), w = converted<T>(p.w, false, o), ent = converted<T>(p.ent, false, o);
  const auto mask = converted<M>(p.mask, true, o);
  const auto slp = spread(lp, T(0.5), olp), sold = spread(old, T(0.5), o), sadv = spread(adv, T(0.5), o), sref = spread(ref, T(0.5), o);
  const auto sw = spread(w, T(0.5), o), sent = spread(ent, T(0.5), o);
  const auto smask = spread(mask, M(0), o);
  const auto view = [&](const auto& v, std::size_t off) {
    using E = typename std::decay_t<decltype(v)>::value_type;
    return ulorl::token_view<const E>::padded(ulorl::matrix_view<const E>(v.data() + off, B, Tn));
  };
  const auto sview = [&](const auto& v) {
    using E = typename std::decay_t<decltype(v)>::value_type;
    return ulorl::token_view<const E>::padded(ulorl::matrix_view<const E>(v.data(), B, Tn, 2 * static_cast<std::ptrdiff_t>(Tn), 2));
  };
  ulorl::policy_loss_inputs<T, M> fin{view(lp, olp), view(old, o), view(adv, o), view(mask, o)};
  ulorl::policy_loss_inputs<T, M> gin{sview(slp), sview(sold), sview(sadv), sview(smask)};
  if (cfg.kl_coef != 0) fin.ref_log_prob = view(ref, o), gin.ref_log_prob = sview(sref);
  if (weights) fin.weights = view(w, o), gin.weights = sview(sw);
  if (entropy) fin.entropy = view(ent, o), gin.entropy = sview(sent);
  const T junk = T(-7);
  buffer<T> fg(o + n + guards, junk), fge(o + n + guards, junk), gg(2 * n, junk), gge(2 * n, junk);
  const auto mat = [&](buffer<T>& v) { return ulorl::token_view<T>::padded(ulorl::matrix_view<T>(v.data() + o, B, Tn)); };
  const auto smat = [&](buffer<T>& v) {
    return ulorl::token_view<T>::padded(ulorl::matrix_view<T>(v.data(), B, Tn, 2 * static_cast<std::ptrdiff_t>(Tn), 2));
  };
  paths out;
  out.fast.res = ulorl::policy_loss(fin, mat(fg), entropy ? mat(fge) : ulorl::token_view<T>{}, cfg);
  out.generic.res = ulorl::policy_loss(gin, smat(gg), entropy ? smat(gge) : ulorl::token_view<T>{}, cfg);
  out.fast.grad.resize(n), out.generic.grad.resize(n);
  if (entropy) out.fast.grad_entropy.resize(n), out.generic.grad_entropy.resize(n);
  for (std::size_t i = 0; i < o + n + guards; ++i)
    if (i < o || i >= o + n) out.fast.gaps_untouched = out.fast.gaps_untouched && fg[i] == junk && fge[i] == junk;
  for (std::size_t i = 0; i < n; ++i) {
    out.fast.grad[i] = static_cast<double>(fg[o + i]);
    out.generic.grad[i] = static_cast<double>(gg[2 * i]);
    out.generic.gaps_untouched = out.generic.gaps_untouched && gg[2 * i + 1] == junk && gge[2 * i + 1] == junk;
    if (entropy) {
      out.fast.grad_entropy[i] = static_cast<double>(fge[o + i]);
      out.generic.grad_entropy[i] = static_cast<double>(gge[2 * i]);
    }
  }
  return out;
}

}  // namespace
}  // namespace loss_paths
