// test_policy_loss_cuda — the CUDA policy loss (kernels/ulorl/kernels/policy_loss.cuh) against the CPU
// policy_loss on the same inputs (cpu_reference.cpp): every objective (token level, and GSPO with
// both gradient routes and GMPO at sequence level) x every KL estimator
// (and none, importance-weighted, straight-through) x every aggregation mode, padded (mask with empty
// rows, a row stride beyond the row) and packed layouts, rollout weights and the entropy term, float
// and bf16 inputs, log-ratios of +-50; determinism (two runs and two grid sizes bitwise equal); the
// device value scan (nothing written, NaN loss, status naming the token); the fused loss from logits
// against the CPU's policy_loss_from_logits. Launcher validation runs first and without a GPU: bad
// arguments return cudaErrorInvalidValue (cudaErrorNotSupported for what the device path lacks) and
// launch nothing. Without a GPU the test then exits 77 (CTest: skipped).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <ulorl/kernels/policy_loss.cuh>

#include "cpu_reference.hpp"
#include "cuda_check.hpp"
#include "device_buffer.hpp"
#include "test_cases.hpp"
#include "test_rng.hpp"

namespace {

namespace uc = ulorl::cuda;
using ulorl_cuda_test::expect;
using ulorl_cuda_test::failures;
using ulorl_cuda_test::loss_case;

// ---- validation (no GPU needed: every check runs before a launch) ------------------------------------

void validation() {
  alignas(256) static unsigned char fake_ws[1 << 16];  // host memory: a launch reading it would fault
  alignas(16) static float fake[64];
  alignas(16) static ulorl::policy_loss_result fake_result;
  const auto lay = uc::token_layout::padded(2, 3);
  uc::policy_loss_inputs<float, float> in{fake, fake, fake};
  uc::policy_loss_outputs out{fake, nullptr, &fake_result, nullptr};
  ulorl::policy_loss_config cfg;
  cfg.normalizer = {ulorl::agg_mode::token_mean, 6.0, 1.0};
  std::size_t bytes = 0;
  expect(
      uc::policy_loss(nullptr, bytes, lay, in, out, cfg) == cudaSuccess && bytes == uc::policy_loss_workspace_bytes(2),
      "validation: workspace query");
  auto call_ws = [&](const uc::token_layout& l, const uc::policy_loss_inputs<float, float>& i,
                     const uc::policy_loss_outputs& o, const ulorl::policy_loss_config& c, std::size_t ws,
                     void* p) { return uc::policy_loss(p, ws, l, i, o, c); };
  auto call = [&](const uc::token_layout& l, const uc::policy_loss_inputs<float, float>& i,
                  const uc::policy_loss_outputs& o,
                  const ulorl::policy_loss_config& c) { return call_ws(l, i, o, c, sizeof(fake_ws), fake_ws); };
  auto invalid = [&](const char* what, cudaError_t e, cudaError_t want = cudaErrorInvalidValue) {
    expect(e == want, std::string("validation: ") + what + " -> " + cudaGetErrorName(e));
  };
  invalid("rows < 0", call(uc::token_layout::padded(-1, 3), in, out, cfg));
  invalid("row_stride < cols", call(uc::token_layout::padded(2, 3, 2), in, out, cfg));
  invalid("workspace too small", call_ws(lay, in, out, cfg, 8, fake_ws));
  invalid("workspace misaligned", call_ws(lay, in, out, cfg, sizeof(fake_ws) - 8, fake_ws + 8));
  {
    auto i = in;
    i.log_prob = nullptr;
    invalid("log_prob null", call(lay, i, out, cfg));
    i = in;
    i.advantages = reinterpret_cast<const float*>(reinterpret_cast<const char*>(fake) + 2);
    invalid("advantages misaligned", call(lay, i, out, cfg));
  }
  {
    auto o = out;
    o.grad_log_prob = nullptr;
    invalid("grad_log_prob null", call(lay, in, o, cfg));
    o = out;
    o.result = nullptr;
    invalid("result null", call(lay, in, o, cfg));
  }
  {
    auto c = cfg;
    c.kl_coef = 0.1;
    invalid("kl_coef without ref_log_prob", call(lay, in, out, c));
    c.kl.estimator = static_cast<ulorl::kl_estimator>(9);
    auto i = in;
    i.ref_log_prob = fake;
    invalid("unknown KL estimator", call(lay, i, out, c));
    c = cfg;
    c.entropy_coef = 0.01;
    invalid("entropy_coef without entropy", call(lay, in, out, c));
    c = cfg;
    c.objective.kind = static_cast<ulorl::objective_kind>(42);
    invalid("unknown objective", call(lay, in, out, c));
    c = cfg;
    c.objective.eps_low = 1.5;
    invalid("eps_low >= 1", call(lay, in, out, c));
    c = cfg;
    c.normalizer.denominator = 0.0;
    invalid("normaliser of zero tokens", call(lay, in, out, c));
    c = cfg;
    c.normalizer.mode = static_cast<ulorl::agg_mode>(17);
    invalid("unknown aggregation mode", call(lay, in, out, c));
    c = cfg;
    c.kl_coef = NAN;
    invalid("kl_coef NaN", call(lay, in, out, c));
    c = cfg;
    c.entropy_coef = 1e-50;  // rounds to 0 in float: the term would vanish
    {
      auto i = in;
      i.entropy = fake;
      auto o = out;
      o.grad_entropy = fake;
      invalid("entropy_coef that float rounds to 0", call(lay, i, o, c));
    }
    c = cfg;
    c.rollout = ulorl::rollout_correction::config{};
    invalid("in-pass rollout correction", call(lay, in, out, c), cudaErrorNotSupported);
  }
  // The fused path's own checks.
  {
    alignas(16) static std::int64_t labels[8];
    uc::policy_loss_inputs<float, float, float> fi{nullptr, fake, fake};
    uc::logits_loss_outputs<float> fo{fake, 4, &fake_result, nullptr};
    uc::logits_config lcfg;
    lcfg.splits = 1;  // an explicit split count: the workspace size needs no device
    std::size_t need = 0;
    expect(uc::policy_loss_from_logits(nullptr, need, fake, 4, 4, labels, lay, fi, fo, cfg, lcfg) == cudaSuccess &&
               need > 0,
           "validation: fused workspace query");
    auto fcall = [&](const uc::token_layout& l, const uc::policy_loss_inputs<float, float, float>& i,
                     const uc::logits_loss_outputs<float>& o, int64_t stride) {
      std::size_t ws = sizeof(fake_ws);
      return uc::policy_loss_from_logits(fake_ws, ws, fake, 4, stride, labels, l, i, o, cfg, lcfg);
    };
    auto i = fi;
    i.log_prob = fake;
    invalid("fused: log_prob given", fcall(lay, i, fo, 4));
    invalid("fused: padded layout not dense", fcall(uc::token_layout::padded(2, 3, 4), fi, fo, 4));
    auto o = fo;
    o.grad_row_stride = 8;
    invalid("fused: in place with another stride", fcall(lay, fi, o, 4));
    invalid("fused: row stride < vocab", fcall(lay, fi, fo, 3));
    o = fo;
    o.result = nullptr;
    invalid("fused: result null", fcall(lay, fi, o, 4));
  }
}

// ---- GPU comparisons -----------------------------------------------------------------------------

using ulorl_cuda_test::dev;

//! Host inputs of one case.
struct host_case {
  std::int64_t rows = 0, cols = 0, row_stride = 0;
  std::vector<std::int64_t> offsets;  // empty: padded
  std::vector<float> lp, old, adv, mask, ref, w, ent;
  std::size_t extent() const { return offsets.empty() ? (rows == 0 ? 0 : (rows - 1) * row_stride + cols) : cols; }
  loss_case view(bool weights, bool entropy) const {
    loss_case c;
    c.rows = rows, c.cols = cols, c.row_stride = row_stride, c.offsets = offsets.empty() ? nullptr : offsets.data();
    c.log_prob = lp.data(), c.old_log_prob = old.data(), c.advantages = adv.data(), c.mask = mask.data();
    c.ref_log_prob = ref.data(), c.weights = weights ? w.data() : nullptr, c.entropy = entropy ? ent.data() : nullptr;
    return c;
  }
  ulorl::batch_counts counts() const { return ulorl_cuda_test::count_mask(rows, cols, row_stride, offsets, mask); }
};

using ulorl_cuda_test::bf16_round;

host_case make_case(ulorl_cuda_test::rng& g, std::int64_t rows, std::int64_t cols, std::int64_t row_stride, bool packed,
                    bool bf16) {
  host_case h;
  h.rows = rows, h.cols = cols, h.row_stride = row_stride;
  if (packed) {
    h.offsets.push_back(0);
    for (std::int64_t b = 0; b < rows; ++b)
      h.offsets.push_back(h.offsets.back() +
                          (b % 5 == 3 ? 0 : 1 + static_cast<std::int64_t>(g() % static_cast<std::uint64_t>(cols + 1))));
    h.cols = h.offsets.back();
  }
  const std::size_t n = h.extent();
  auto fill = [&](std::vector<float>& v, auto f) {
    v.resize(n);
    for (auto& x : v) x = bf16 ? bf16_round(static_cast<float>(f())) : static_cast<float>(f());
  };
  fill(h.old, [&] { return -4.0 * g.uniform(); });
  h.lp.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double step = g.uniform() < 0.02 ? (g.uniform() < 0.5 ? -50.0 : 50.0) : (g.uniform() - 0.5) * 1.5;
    h.lp[i] = static_cast<float>(h.old[i] + step);
    if (bf16) h.lp[i] = bf16_round(h.lp[i]);
  }
  fill(h.ref, [&] { return -4.0 * g.uniform() + (g.uniform() < 0.05 ? 40.0 : 0.0); });
  fill(h.adv, [&] { return (g.uniform() - 0.5) * 4.0; });
  fill(h.w, [&] { return 0.5 + g.uniform(); });
  fill(h.ent, [&] { return 3.0 * g.uniform(); });
  h.mask.assign(n, 0.0f);
  for (std::int64_t b = 0; b < rows; ++b) {
    const std::int64_t lo = packed ? h.offsets[b] : b * row_stride;
    const std::int64_t len = packed ? h.offsets[b + 1] - h.offsets[b] : cols;
    const bool empty_row = b % 4 == 1;  // rows without a valid token
    const std::int64_t valid = empty_row ? 0 : static_cast<std::int64_t>(g() % static_cast<std::uint64_t>(len + 1));
    for (std::int64_t t = 0; t < valid; ++t) h.mask[lo + t] = 1.0f;
  }
  return h;
}

using ulorl_cuda_test::close;

//! The device copies of a case's inputs in T.
template <class T>
struct dev_case {
  dev<T> lp, old, adv, ref, w, ent;
  dev<float> mask;
  dev<std::int64_t> offsets;
  explicit dev_case(const host_case& h)
      : lp(h.extent()),
        old(h.extent()),
        adv(h.extent()),
        ref(h.extent()),
        w(h.extent()),
        ent(h.extent()),
        mask(h.extent()),
        offsets(h.offsets.size()) {
    auto put = [](dev<T>& d, const std::vector<float>& v) {
      std::vector<T> t(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) t[i] = uc::detail::from_float<T>(v[i]);
      d.put(t);
    };
    put(lp, h.lp), put(old, h.old), put(adv, h.adv), put(ref, h.ref), put(w, h.w), put(ent, h.ent);
    mask.put(h.mask);
    if (!h.offsets.empty()) offsets.put(h.offsets);
  }
  uc::token_layout layout(const host_case& h) const {
    return h.offsets.empty() ? uc::token_layout::padded(h.rows, h.cols, h.row_stride)
                             : uc::token_layout::packed(h.rows, h.cols, offsets.p);
  }
  uc::policy_loss_inputs<T, float> inputs(bool weights, bool entropy) const {
    return {lp.p, old.p, adv.p, mask.p, ref.p, weights ? w.p : nullptr, entropy ? ent.p : nullptr};
  }
};

struct run_out {
  ulorl::policy_loss_result res;
  std::vector<float> grad, gent;
  std::int64_t status = 0;
};

template <class T>
run_out run_device(const host_case& h, const dev_case<T>& d, const ulorl::policy_loss_config& cfg, bool weights,
                   bool entropy, int grid, float fill = 12345.0f) {
  const std::size_t n = h.extent();
  dev<float> g(n), ge(n);
  dev<ulorl::policy_loss_result> r(1);
  dev<std::int64_t> st(1);
  std::vector<float> filled(n, fill);
  g.put(filled), ge.put(filled);
  std::size_t bytes = 0;
  const auto lay = d.layout(h);
  const auto in = d.inputs(weights, entropy);
  const uc::policy_loss_outputs out{g.p, entropy ? ge.p : nullptr, r.p, st.p};
  CUDA_OK(uc::policy_loss(nullptr, bytes, lay, in, out, cfg));
  dev<unsigned char> ws(bytes);
  CUDA_OK(uc::policy_loss(ws.p, bytes, lay, in, out, cfg, uc::launch_config{grid}));
  CUDA_OK(cudaDeviceSynchronize());
  run_out o;
  o.res = r.get()[0];
  o.grad = g.get();
  o.gent = ge.get();
  o.status = st.get()[0];
  return o;
}

//! Compares the device with the CPU on the valid positions of the layout (gaps stay untouched).
template <class T>
void compare(const std::string& name, const host_case& h, const dev_case<T>& d, const ulorl::policy_loss_config& cfg,
             bool weights, bool entropy) {
  const std::size_t n = h.extent();
  std::vector<float> cg(n, 12345.0f), cge(n, 12345.0f);
  const ulorl::policy_loss_result c =
      ulorl_cuda_test::cpu_policy_loss(h.view(weights, entropy), cfg, cg.data(), entropy ? cge.data() : nullptr);
  const run_out g = run_device(h, d, cfg, weights, entropy, 0);
  int bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const bool ok = close(g.grad[i], cg[i], 2e-5) && (!entropy || close(g.gent[i], cge[i], 1e-6));
    if (!ok && bad++ < 3)
      std::printf("  %s token %zu: grad device %.9g cpu %.9g, grad_entropy device %.9g cpu %.9g\n", name.c_str(), i,
                  g.grad[i], cg[i], g.gent[i], cge[i]);
  }
  const auto& a = g.res.metrics;
  const auto& b = c.metrics;
  const bool sums = close(g.res.loss, c.loss, 1e-5) && close(g.res.pg_loss, c.pg_loss, 1e-5) &&
                    close(g.res.kl_loss, c.kl_loss, 1e-5) && close(g.res.entropy_loss, c.entropy_loss, 1e-5) &&
                    a.tokens == b.tokens && a.sequences == b.sequences && a.rows == b.rows &&
                    std::fabs(a.clipped - b.clipped) <= 2 && std::fabs(a.clipped_low - b.clipped_low) <= 2 &&
                    std::fabs(a.clipped_high - b.clipped_high) <= 2 &&
                    std::fabs(a.dual_clipped - b.dual_clipped) <= 2 && close(a.neg_log_ratio, b.neg_log_ratio, 1e-6) &&
                    close(a.neg_log_ratio_clamped, b.neg_log_ratio_clamped, 1e-6) &&
                    close(a.approx_kl_k3, b.approx_kl_k3, 1e-5) && close(a.ratio_sum, b.ratio_sum, 1e-5) &&
                    close(a.ratio_min, b.ratio_min, 1e-6) && close(a.ratio_max, b.ratio_max, 1e-6) &&
                    close(a.kl_sum, b.kl_sum, 1e-5) && close(a.entropy_sum, b.entropy_sum, 1e-6) && g.status == 0;
  if (!sums) {
    ++bad;
    std::printf("  %s: device loss %.12g pg %.12g kl %.12g ent %.12g clipped %g tokens %g status %lld\n", name.c_str(),
                g.res.loss, g.res.pg_loss, g.res.kl_loss, g.res.entropy_loss, a.clipped, a.tokens,
                static_cast<long long>(g.status));
    std::printf("  %s: cpu    loss %.12g pg %.12g kl %.12g ent %.12g clipped %g tokens %g\n", name.c_str(), c.loss,
                c.pg_loss, c.kl_loss, c.entropy_loss, b.clipped, b.tokens);
  }
  if (bad) {
    ++failures;
    std::printf("FAIL %s\n", name.c_str());
  }
}

struct objective_case {
  const char* name;
  ulorl::objective_config cfg;
};

std::vector<objective_case> objectives() {
  std::vector<objective_case> v;
  ulorl::objective_config c;
  c.eps_low = 0.2, c.eps_high = 0.28;
  v.push_back({"ppo_clip (clip-higher)", c});
  c.dual_clip = 3.0, c.delta = 1.5;
  v.push_back({"ppo_clip (dual clip, delta)", c});
  c = {};
  c.kind = ulorl::objective_kind::cispo, c.eps_low = 0.2, c.eps_high = 0.28;
  v.push_back({"cispo", c});
  c = {};
  c.kind = ulorl::objective_kind::sapo;
  v.push_back({"sapo", c});
  c = {};
  c.kind = ulorl::objective_kind::policy_gradient;
  v.push_back({"policy_gradient", c});
  c = {};
  c.kind = ulorl::objective_kind::penalized_pg, c.penalized_pg.abs_penalty = 0.1, c.penalized_pg.square_penalty = 0.2;
  v.push_back({"penalized_pg", c});
  c = {};
  c.kind = ulorl::objective_kind::gspo, c.eps_low = 3e-4, c.eps_high = 4e-4;
  v.push_back({"gspo (own token)", c});
  c.gspo.seq_gradient = ulorl::sequence_gradient::through_mean;
  v.push_back({"gspo (through the mean)", c});
  c = {};
  c.kind = ulorl::objective_kind::gmpo, c.eps_low = 0.4, c.eps_high = 0.4;
  v.push_back({"gmpo", c});
  return v;
}

struct kl_case {
  const char* name;
  double coef;
  ulorl::kl_config cfg;
};

std::vector<kl_case> estimators() {
  std::vector<kl_case> v;
  v.push_back({"no KL", 0.0, {}});
  struct named {
    const char* name;
    ulorl::kl_estimator estimator;
  };
  const named plain[] = {{"k1", ulorl::kl_estimator::k1},
                         {"abs", ulorl::kl_estimator::abs},
                         {"k2", ulorl::kl_estimator::k2},
                         {"k3", ulorl::kl_estimator::k3}};
  for (const named& e : plain) {
    ulorl::kl_config k;
    k.estimator = e.estimator, k.input_clamp = 20.0, k.output_clamp = 10.0;
    v.push_back({e.name, 0.04, k});
  }
  ulorl::kl_config k;
  k.estimator = ulorl::kl_estimator::k3, k.importance_weighted = true;
  v.push_back({"k3 importance-weighted", 0.04, k});
  k.importance_weighted = false, k.straight_through = true;
  v.push_back({"k3 straight-through", 0.04, k});
  return v;
}

template <class T>
void matrix(const char* dtype, ulorl_cuda_test::rng& g) {
  const bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  const host_case padded = make_case(g, 13, 517, 523, false, bf16);  // odd sizes, a stride beyond the row
  const host_case packed = make_case(g, 11, 700, 0, true, bf16);
  const dev_case<T> dpad(padded), dpack(packed);
  const ulorl::agg_mode modes[] = {ulorl::agg_mode::token_mean, ulorl::agg_mode::seq_mean_token_sum,
                                   ulorl::agg_mode::seq_mean_token_mean, ulorl::agg_mode::seq_mean_token_sum_norm,
                                   ulorl::agg_mode::constant};
  int cases = 0;
  for (const auto& o : objectives())
    for (const auto& k : estimators())
      for (const auto mode : modes)
        for (int layout = 0; layout < 2; ++layout) {
          const host_case& h = layout == 0 ? padded : packed;
          ulorl::policy_loss_config cfg;
          cfg.objective = o.cfg;
          cfg.kl = k.cfg;
          cfg.kl_coef = k.coef;
          const bool weights = (cases % 3) != 0, entropy = (cases % 2) == 0;
          cfg.entropy_coef = entropy ? 0.01 : 0.0;
          cfg.normalizer = ulorl::global_normalizer(mode, h.counts(), 4096.0, 2.0);
          const std::string name = std::string(dtype) + " / " + o.name + " / " + k.name + " / mode " +
                                   std::to_string(static_cast<int>(mode)) + (layout == 0 ? " / padded" : " / packed") +
                                   (weights ? " / weights" : "") + (entropy ? " / entropy" : "");
          compare(name, h, layout == 0 ? dpad : dpack, cfg, weights, entropy);
          ++cases;
        }
  std::printf("%s: %d configurations compared with the CPU\n", dtype, cases);
}

void determinism(ulorl_cuda_test::rng& g) {
  const host_case h = make_case(g, 301, 1031, 1031, false, false);
  const dev_case<float> d(h);
  ulorl::policy_loss_config cfg;
  cfg.objective.eps_high = 0.28;
  cfg.kl_coef = 0.01;
  cfg.entropy_coef = 0.001;
  cfg.normalizer = ulorl::global_normalizer(ulorl::agg_mode::seq_mean_token_mean, h.counts());
  const run_out a = run_device(h, d, cfg, true, true, 0), b = run_device(h, d, cfg, true, true, 0);
  const run_out c = run_device(h, d, cfg, true, true, 1), e = run_device(h, d, cfg, true, true, 37);
  auto same = [](const run_out& x, const run_out& y) {
    return std::memcmp(&x.res, &y.res, sizeof(x.res)) == 0 && x.grad == y.grad && x.gent == y.gent;
  };
  expect(same(a, b), "determinism: two runs bitwise equal");
  expect(same(a, c) && same(a, e), "determinism: grids of 1, 37 and automatic blocks bitwise equal");
}

void value_scan(ulorl_cuda_test::rng& g) {
  host_case h = make_case(g, 6, 100, 100, false, false);
  h.lp[250] = NAN;
  h.adv[420] = INFINITY;
  {
    const dev_case<float> d(h);
    ulorl::policy_loss_config cfg;
    cfg.normalizer = ulorl::global_normalizer(ulorl::agg_mode::token_mean, h.counts());
    const run_out o = run_device(h, d, cfg, false, false, 0, 777.0f);
    bool untouched = true;
    for (float x : o.grad) untouched = untouched && x == 777.0f;
    expect(o.status == 251 && std::isnan(o.res.loss) && untouched,
           "value scan: a NaN log-prob stops the loss (status " + std::to_string(o.status) + ", gradients untouched)");
    cfg.check_values = false;
    const run_out p = run_device(h, d, cfg, false, false, 0, 777.0f);
    expect(p.status == 0 && std::isnan(p.res.loss), "value scan off: the NaN flows into the loss");
  }
  {
    host_case m = make_case(g, 6, 100, 100, false, false);
    m.mask[333] = 0.5f;
    const dev_case<float> d(m);
    ulorl::policy_loss_config cfg;
    cfg.normalizer = ulorl::global_normalizer(ulorl::agg_mode::token_mean, m.counts());
    const run_out o = run_device(m, d, cfg, false, false, 0);
    expect(o.status == 334, "value scan: a mask value 0.5 (status " + std::to_string(o.status) + ")");
  }
  {
    host_case p = make_case(g, 6, 50, 0, true, false);
    p.offsets[3] = p.offsets[4] + 1;  // row 2 ends after row 3's end: row 3 runs backwards
    const dev_case<float> d(p);
    ulorl::policy_loss_config cfg;
    cfg.normalizer = {ulorl::agg_mode::token_mean, 10.0, 1.0};
    cfg.check_values = false;
    const run_out o = run_device(p, d, cfg, false, false, 0, 5.0f);
    expect(o.status == -4 && std::isnan(o.res.loss),
           "packed offsets: a decreasing row (status " + std::to_string(o.status) + ")");
  }
}

//! The fused loss from logits in G (float, __half, __nv_bfloat16) against the CPU's on the same
//! stored values: 3% of the logits -inf, rows `pad` elements beyond the vocabulary (pad 3: rows not
//! 16-byte aligned, the scalar path), the gradient in place.
template <class G>
void from_logits_case(ulorl_cuda_test::rng& g, bool packed, std::int64_t pad, const char* gname) {
  const host_case h = make_case(g, 5, 37, 37, packed, false);
  const std::int64_t vocab = 1000, stride = vocab + pad, n = static_cast<std::int64_t>(h.extent());
  std::vector<float> logits(static_cast<std::size_t>(n * vocab));
  std::vector<std::int64_t> labels(static_cast<std::size_t>(n));
  for (auto& y : labels) y = static_cast<std::int64_t>(g() % static_cast<std::uint64_t>(vocab));
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < vocab; ++j) {
      const bool off = j != labels[static_cast<std::size_t>(i)] && g.uniform() < 0.03;
      const float x = off ? -INFINITY : static_cast<float>(g.normal(0.0, 3.0));
      logits[static_cast<std::size_t>(i * vocab + j)] =
          uc::detail::to_float(uc::detail::from_float<G>(x));  // G's value
    }
  ulorl::policy_loss_config cfg;
  cfg.objective.eps_high = 0.28;
  cfg.kl_coef = 0.02;
  cfg.entropy_coef = 0.005;
  cfg.normalizer = ulorl::global_normalizer(ulorl::agg_mode::token_mean, h.counts());
  std::vector<float> cgrad(logits.size());
  const ulorl::policy_loss_result c = ulorl_cuda_test::cpu_loss_from_logits(
      logits.data(), vocab, labels.data(), h.view(true, false), cfg, 0.9f, cgrad.data());
  std::vector<G> strided(static_cast<std::size_t>(n * stride), uc::detail::from_float<G>(0.0f));
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < vocab; ++j)
      strided[static_cast<std::size_t>(i * stride + j)] =
          uc::detail::from_float<G>(logits[static_cast<std::size_t>(i * vocab + j)]);
  const dev_case<float> d(h);
  dev<G> dl(strided.size());
  dl.put(strided);
  dev<std::int64_t> dlab(labels.size());
  dlab.put(labels);
  dev<ulorl::policy_loss_result> r(1);
  dev<std::int64_t> st(1);
  const auto in = d.inputs(true, false);
  const uc::policy_loss_inputs<float, float, float> fin{nullptr,         in.old_log_prob, in.advantages, in.mask,
                                                        in.ref_log_prob, in.weights,      nullptr};
  uc::logits_config lcfg;
  lcfg.temperature = 0.9f;
  const uc::logits_loss_outputs<G> out{dl.p, stride, r.p, st.p};  // in place
  std::size_t bytes = 0;
  CUDA_OK(uc::policy_loss_from_logits(nullptr, bytes, dl.p, vocab, stride, dlab.p, d.layout(h), fin, out, cfg, lcfg));
  dev<unsigned char> ws(bytes);
  CUDA_OK(uc::policy_loss_from_logits(ws.p, bytes, dl.p, vocab, stride, dlab.p, d.layout(h), fin, out, cfg, lcfg));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<G> ggrad = dl.get();
  const ulorl::policy_loss_result gr = r.get()[0];
  double worst = 0, scale = 0;  // the largest difference relative to the largest gradient
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < vocab; ++j) {
      const double dv = uc::detail::to_float(ggrad[static_cast<std::size_t>(i * stride + j)]);
      const double cv = cgrad[static_cast<std::size_t>(i * vocab + j)];
      worst = std::fmax(worst, std::fabs(dv - cv));
      scale = std::fmax(scale, std::fabs(cv));
    }
  worst /= scale > 0 ? scale : 1.0;
  // The gradient is stored in G: float to 1e-4 of the largest, half and bf16 to their rounding.
  const double tol = std::is_same_v<G, float> ? 1e-4 : std::is_same_v<G, __half> ? 2e-3 : 1e-2;
  const bool ok = close(gr.loss, c.loss, 1e-5) && gr.metrics.tokens == c.metrics.tokens && st.get()[0] == 0;
  expect(ok && worst < tol, std::string("from logits (") + gname + (packed ? ", packed" : ", padded") + ", row pad " +
                                std::to_string(pad) + "): loss device " + std::to_string(gr.loss) + " cpu " +
                                std::to_string(c.loss) + ", worst gradient difference " + std::to_string(worst) +
                                " of the largest");
}

void from_logits(ulorl_cuda_test::rng& g) {
  for (bool packed : {false, true})
    for (std::int64_t pad : {0, 3}) {
      from_logits_case<float>(g, packed, pad, "float");
      from_logits_case<__nv_bfloat16>(g, packed, pad, "bf16");
      from_logits_case<__half>(g, packed, pad, "fp16");
    }
}

}  // namespace

int main() {
  validation();
  if (int rc = 0; !ulorl_cuda_test::gpu_after_validation("test_policy_loss_cuda", rc)) return rc;
  ulorl_cuda_test::rng g(2024);
  matrix<float>("float", g);
  matrix<__nv_bfloat16>("bf16", g);
  determinism(g);
  value_scan(g);
  from_logits(g);
  std::printf("%s\n", failures == 0 ? "test_policy_loss_cuda: PASS" : "test_policy_loss_cuda: FAIL");
  return failures == 0 ? 0 : 1;
}
