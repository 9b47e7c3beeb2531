// test_linear_head_cuda — the CUDA chunked fused linear head (kernels/ulorl/kernels/linear_head.cuh)
// against the CPU linear head's policy_loss_from_hidden on the same inputs (cpu_reference_linear_head.cpp):
// loss, metrics, every token's statistics (seen by a hook), grad_hidden and grad_weight, for float and
// bf16 operands (the CPU gets the bf16 values as floats), padded and packed layouts, several chunks
// with a shorter last one, split rows in the forward, with and without the KL and entropy terms;
// determinism (two runs bitwise equal), grad_weight accumulation, a hook's error, no tokens, and an
// out-of-range label. Launcher validation runs first and without a GPU (every bad argument gives
// cudaErrorInvalidValue, cudaErrorNotSupported for what the device loss lacks, and nothing is
// launched; no cuBLAS handle exists yet); without a GPU the test then exits 77 (CTest: skipped).
#include <cublas_v2.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <ulorl/kernels/linear_head.cuh>

#include "cpu_reference_linear_head.hpp"
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

//! Every argument of one call; the defaults are a valid call on host memory (N = 6, H = 4, V = 5).
struct call_args {
  const float* hidden;
  std::int64_t tokens = 6, hidden_size = 4;
  const float* weight;
  std::int64_t vocab = 5;
  const std::int64_t* labels;
  uc::token_layout lay = uc::token_layout::padded(2, 3);
  uc::policy_loss_inputs<float, float, float> in;
  uc::linear_head_outputs<float> out;
  ulorl::policy_loss_config cfg;
  uc::logits_config lcfg;
  uc::linear_head_launch_config opt;
};

void validation() {
  alignas(256) static unsigned char fake_ws[1 << 16];  // host memory: a launch reading it would fault
  alignas(16) static float hidden[64], weight[64], grad_hidden[64], grad_weight[64], token_values[64];
  alignas(16) static std::int64_t labels[8];
  alignas(16) static ulorl::policy_loss_result result;
  call_args base;
  base.hidden = hidden, base.weight = weight, base.labels = labels;
  base.in = {nullptr, token_values, token_values};
  base.out = {grad_hidden, grad_weight, &result, nullptr};
  base.cfg.normalizer = {ulorl::agg_mode::token_mean, 6.0, 1.0};
  base.lcfg.splits = 1;  // an explicit split count: the workspace size needs no device
  base.opt.chunk_rows = 4;
  // d_temp_storage == nullptr: the query, which validates every argument but the workspace and the handle.
  auto query = [](const call_args& a, std::size_t& bytes) {
    return uc::policy_loss_from_hidden(nullptr, bytes, nullptr, a.hidden, a.tokens, a.hidden_size, a.weight, a.vocab,
                                       a.labels, a.lay, a.in, a.out, a.cfg, a.lcfg, a.opt);
  };
  auto run = [](const call_args& a, void* ws, std::size_t bytes) {
    return uc::policy_loss_from_hidden(ws, bytes, nullptr, a.hidden, a.tokens, a.hidden_size, a.weight, a.vocab,
                                       a.labels, a.lay, a.in, a.out, a.cfg, a.lcfg, a.opt);
  };
  std::size_t need = 0;
  expect(query(base, need) == cudaSuccess && need > 0 && need <= sizeof(fake_ws), "validation: workspace query");
  {
    std::size_t bytes = 0;
    std::int64_t chunk = 0;
    expect(uc::linear_head_workspace_bytes<float>(6, 5, 2, bytes, chunk, base.lcfg, base.opt) == cudaSuccess &&
               bytes == need && chunk == 4,
           "validation: linear_head_workspace_bytes agrees with the query");
  }
  auto invalid = [&](const char* what, const call_args& a, cudaError_t want = cudaErrorInvalidValue) {
    std::size_t bytes = 0;
    const cudaError_t e = query(a, bytes);
    expect(e == want, std::string("validation: ") + what + " -> " + cudaGetErrorName(e));
  };
  call_args a = base;
  a.tokens = -1;
  invalid("tokens < 0", a);
  a = base, a.tokens = 5;
  invalid("tokens != the layout's tokens", a);
  a = base, a.hidden_size = 0;
  invalid("H = 0", a);
  a = base, a.vocab = 0;
  invalid("V = 0", a);
  a = base, a.vocab = std::int64_t{1} << 31;
  invalid("V beyond int", a);
  a = base, a.hidden = nullptr;
  invalid("hidden null", a);
  a = base, a.weight = nullptr;
  invalid("weight null", a);
  a = base, a.labels = nullptr;
  invalid("labels null", a);
  a = base, a.hidden = reinterpret_cast<const float*>(reinterpret_cast<const char*>(hidden) + 2);
  invalid("hidden misaligned", a);
  a = base, a.lay = uc::token_layout::padded(2, 3, 4);
  invalid("padded layout not dense", a);
  a = base, a.in.log_prob = token_values;
  invalid("log_prob given", a);
  a = base, a.in.entropy = token_values;
  invalid("entropy given", a);
  a = base, a.in.old_log_prob = nullptr;
  invalid("old_log_prob null", a);
  a = base, a.out.result = nullptr;
  invalid("result null", a);
  a = base, a.out.grad_hidden = hidden + 8;
  invalid("grad_hidden overlaps hidden", a);
  a = base, a.out.grad_weight = weight;
  invalid("grad_weight is weight", a);
  a = base, a.out.grad_weight = grad_hidden + 4;
  invalid("grad_weight overlaps grad_hidden", a);
  a = base, a.opt.chunk_rows = -1;
  invalid("chunk_rows < 0", a);
  a = base, a.opt.loss.grid_blocks = -1;
  invalid("loss grid_blocks < 0", a);
  a = base, a.lcfg.temperature = 0.0f;
  invalid("temperature 0", a);
  a = base, a.lcfg.temperature = NAN;
  invalid("temperature NaN", a);
  a = base, a.lcfg.splits = -1;
  invalid("splits < 0", a);
  a = base, a.cfg.kl_coef = 0.1;
  invalid("kl_coef without ref_log_prob", a);
  a = base, a.cfg.objective.kind = static_cast<ulorl::objective_kind>(42);
  invalid("unknown objective", a);
  a = base, a.cfg.normalizer.denominator = 0.0;
  invalid("normaliser of zero tokens", a);
  a = base, a.cfg.objective.kind = ulorl::objective_kind::gspo;
  invalid("gspo (sequence level) accepted", a, cudaSuccess);
  a = base, a.cfg.rollout = ulorl::rollout_correction::config{};
  invalid("in-pass rollout correction", a, cudaErrorNotSupported);
  // The running call's own checks (a valid call otherwise; none reaches the handle).
  auto invalid_run = [&](const char* what, void* ws, std::size_t bytes) {
    const cudaError_t e = run(base, ws, bytes);
    expect(e == cudaErrorInvalidValue, std::string("validation: ") + what + " -> " + cudaGetErrorName(e));
  };
  invalid_run("workspace too small", fake_ws, need - 1);
  invalid_run("workspace misaligned", fake_ws + 16, need);
  invalid_run("no cuBLAS handle", fake_ws, need);
}

// ---- GPU comparisons -----------------------------------------------------------------------------

using ulorl_cuda_test::dev;

using ulorl_cuda_test::bf16_round;

//! Host inputs of one case: the head (hidden, weight, labels) and the loss's token arrays, in a
//! dense padded layout [rows, cols] or a packed one (offsets).
struct head_case {
  std::int64_t rows = 0, cols = 0, tokens = 0, hidden_size = 0, vocab = 0;
  std::vector<std::int64_t> offsets;  // empty: padded
  std::vector<float> hidden, weight, old, adv, mask, ref, w;
  std::vector<std::int64_t> labels;
  loss_case view() const {
    loss_case c;
    c.rows = rows, c.cols = cols, c.row_stride = cols, c.offsets = offsets.empty() ? nullptr : offsets.data();
    c.old_log_prob = old.data(), c.advantages = adv.data(), c.mask = mask.data(), c.ref_log_prob = ref.data();
    c.weights = w.data();
    return c;
  }
  ulorl::batch_counts counts() const { return ulorl_cuda_test::count_mask(rows, cols, cols, offsets, mask); }
};

//! A case whose old and reference log-probs sit near the current policy's (from a first CPU run), so
//! that ratios are near 1 and the loss's clipping, KL and entropy terms all take part.
head_case make_case(ulorl_cuda_test::rng& g, std::int64_t rows, std::int64_t cols, bool packed,
                    std::int64_t hidden_size, std::int64_t vocab, bool bf16, float temperature) {
  head_case h;
  h.rows = rows, h.cols = cols, h.hidden_size = hidden_size, h.vocab = vocab;
  if (packed) {
    h.offsets.push_back(0);
    for (std::int64_t b = 0; b < rows; ++b)
      h.offsets.push_back(h.offsets.back() +
                          (b == 2 ? 0 : 1 + static_cast<std::int64_t>(g() % static_cast<std::uint64_t>(cols))));
    h.cols = h.offsets.back();
  }
  h.tokens = packed ? h.cols : rows * cols;
  const auto n = static_cast<std::size_t>(h.tokens);
  auto value = [&](double x) { return bf16 ? bf16_round(static_cast<float>(x)) : static_cast<float>(x); };
  h.hidden.resize(n * static_cast<std::size_t>(hidden_size));
  h.weight.resize(static_cast<std::size_t>(vocab * hidden_size));
  for (auto& x : h.hidden) x = value(g.normal(0.0, 1.0));
  const double wsd = 2.5 / std::sqrt(static_cast<double>(hidden_size));  // logits of standard deviation ~2.5
  for (auto& x : h.weight) x = value(g.normal(0.0, wsd));
  h.labels.resize(n);
  for (auto& y : h.labels) y = static_cast<std::int64_t>(g() % static_cast<std::uint64_t>(vocab));
  h.mask.assign(n, 0.0f);
  for (std::int64_t b = 0; b < rows; ++b) {
    const std::int64_t lo = packed ? h.offsets[b] : b * cols;
    const std::int64_t len = packed ? h.offsets[b + 1] - h.offsets[b] : cols;
    const std::int64_t valid = b == 1 ? 0 : 1 + static_cast<std::int64_t>(g() % static_cast<std::uint64_t>(len + 1));
    for (std::int64_t t = 0; t < valid && t < len; ++t) h.mask[lo + t] = 1.0f;
  }
  h.old.assign(n, -5.0f), h.ref.assign(n, -5.0f), h.adv.resize(n), h.w.resize(n);
  for (auto& x : h.adv) x = static_cast<float>((g.uniform() - 0.5) * 4.0);
  for (auto& x : h.w) x = static_cast<float>(0.5 + g.uniform());
  // The current log-probs, then the old and reference ones around them.
  ulorl::policy_loss_config cfg;
  cfg.normalizer = {ulorl::agg_mode::token_mean, 1.0, 1.0};
  std::vector<float> gh(h.hidden.size()), gw(h.weight.size()), lp(n), ent(n), lse(n);
  (void)ulorl_cuda_test::cpu_loss_from_hidden(h.hidden.data(), h.tokens, hidden_size, h.weight.data(), vocab,
                                              h.labels.data(), h.view(), cfg, temperature, 0, gh.data(), gw.data(),
                                              lp.data(), ent.data(), lse.data());
  for (std::size_t i = 0; i < n; ++i) {
    h.old[i] = static_cast<float>(lp[i] + g.uniform(-0.4, 0.4));
    h.ref[i] = static_cast<float>(lp[i] + g.uniform(-0.6, 0.6));
  }
  return h;
}

using ulorl_cuda_test::close;

//! The largest |a - b| over the largest |b|.
double worst_relative(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    worst = std::isnan(d) ? INFINITY : std::fmax(worst, d);
    scale = std::fmax(scale, std::fabs(static_cast<double>(b[i])));
  }
  return worst / (scale > 0 ? scale : 1.0);
}

template <class T>
std::vector<T> to_device_type(const std::vector<float>& v) {
  std::vector<T> t(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) t[i] = uc::detail::from_float<T>(v[i]);
  return t;
}
template <class T>
std::vector<float> to_host_float(const std::vector<T>& v) {
  std::vector<float> f(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) f[i] = uc::detail::to_float(v[i]);
  return f;
}

//! The device copies of a case (head operands in T, token arrays in float).
template <class T>
struct dev_case {
  dev<T> hidden, weight;
  dev<std::int64_t> labels, offsets;
  dev<float> old, adv, mask, ref, w;
  explicit dev_case(const head_case& h)
      : hidden(h.hidden.size()),
        weight(h.weight.size()),
        labels(h.labels.size()),
        offsets(h.offsets.size()),
        old(h.old.size()),
        adv(h.adv.size()),
        mask(h.mask.size()),
        ref(h.ref.size()),
        w(h.w.size()) {
    hidden.put(to_device_type<T>(h.hidden));
    weight.put(to_device_type<T>(h.weight));
    labels.put(h.labels);
    if (!h.offsets.empty()) offsets.put(h.offsets);
    old.put(h.old), adv.put(h.adv), mask.put(h.mask), ref.put(h.ref), w.put(h.w);
  }
  uc::token_layout layout(const head_case& h) const {
    return h.offsets.empty() ? uc::token_layout::padded(h.rows, h.cols)
                             : uc::token_layout::packed(h.rows, h.cols, offsets.p);
  }
  uc::policy_loss_inputs<float, float, float> inputs() const {
    return {nullptr, old.p, adv.p, mask.p, ref.p, w.p, nullptr};
  }
};

//! Copies every token's statistics out of the launcher's workspace when it calls the hook.
struct copy_statistics {
  float *log_prob, *entropy, *lse;
  cudaError_t operator()(const uc::device_token_statistics& s, cudaStream_t stream) const {
    const std::size_t bytes = static_cast<std::size_t>(s.tokens) * sizeof(float);
    if (s.tokens == 0) return cudaSuccess;
    if (cudaError_t e = cudaMemcpyAsync(log_prob, s.log_prob, bytes, cudaMemcpyDeviceToDevice, stream);
        e != cudaSuccess)
      return e;
    if (cudaError_t e = cudaMemcpyAsync(entropy, s.entropy, bytes, cudaMemcpyDeviceToDevice, stream); e != cudaSuccess)
      return e;
    return cudaMemcpyAsync(lse, s.lse, bytes, cudaMemcpyDeviceToDevice, stream);
  }
};

struct run_out {
  cudaError_t err = cudaSuccess;
  ulorl::policy_loss_result res{};
  std::vector<float> grad_hidden, grad_weight, log_prob, entropy, lse;
  std::int64_t status = 0;
  int bad_label_row = 0;
};

//! One device call; grad_weight starts as `gw_start` (or 12345 everywhere), grad_hidden as 12345.
template <class T, class Hook = copy_statistics>
run_out run_device(cublasHandle_t handle, cudaStream_t stream, const head_case& h, const dev_case<T>& d,
                   const ulorl::policy_loss_config& cfg, float temperature, int splits,
                   const uc::linear_head_launch_config& opt, const std::vector<float>* gw_start = nullptr,
                   const Hook* custom_hook = nullptr) {
  const auto n = static_cast<std::size_t>(h.tokens);
  dev<T> gh(h.hidden.size());
  dev<float> gw(h.weight.size()), lp(n), ent(n), lse(n);
  dev<ulorl::policy_loss_result> r(1);
  dev<std::int64_t> st(1);
  dev<int> bad(1);
  gh.put(to_device_type<T>(std::vector<float>(h.hidden.size(), 12345.0f)));
  gw.put(gw_start != nullptr ? *gw_start : std::vector<float>(h.weight.size(), 12345.0f));
  bad.put(std::vector<int>(1, 0));
  uc::logits_config lcfg;
  lcfg.temperature = temperature;
  lcfg.splits = splits;
  lcfg.bad_label_row = bad.p;
  const uc::linear_head_outputs<T> out{gh.p, gw.p, r.p, st.p};
  const auto lay = d.layout(h);
  const auto in = d.inputs();
  std::size_t bytes = 0;
  CUDA_OK(uc::policy_loss_from_hidden(nullptr, bytes, nullptr, d.hidden.p, h.tokens, h.hidden_size, d.weight.p, h.vocab,
                                      d.labels.p, lay, in, out, cfg, lcfg, opt, stream));
  dev<unsigned char> ws(bytes);
  run_out o;
  const copy_statistics copy{lp.p, ent.p, lse.p};
  if constexpr (std::is_same_v<Hook, copy_statistics>)
    o.err = uc::policy_loss_from_hidden(ws.p, bytes, handle, d.hidden.p, h.tokens, h.hidden_size, d.weight.p, h.vocab,
                                        d.labels.p, lay, in, out, cfg, lcfg, opt, stream, copy);
  else
    o.err = uc::policy_loss_from_hidden(ws.p, bytes, handle, d.hidden.p, h.tokens, h.hidden_size, d.weight.p, h.vocab,
                                        d.labels.p, lay, in, out, cfg, lcfg, opt, stream, *custom_hook);
  CUDA_OK(cudaStreamSynchronize(stream));
  o.res = r.get()[0];
  o.grad_hidden = to_host_float(gh.get());
  o.grad_weight = gw.get();
  o.log_prob = lp.get(), o.entropy = ent.get(), o.lse = lse.get();
  o.status = st.get()[0];
  o.bad_label_row = bad.get()[0];
  return o;
}

//! The loss configurations of the comparisons.
enum class loss_kind {
  full,      //!< PPO clip-higher with the k3 KL and entropy terms, token mean
  seq_mean,  //!< PPO clip-higher alone, sequence mean of token means
  gspo,      //!< GSPO (sequence level) with the KL term, sequence mean of token means
};

ulorl::policy_loss_config loss_config(const head_case& h, loss_kind kind) {
  ulorl::policy_loss_config cfg;
  cfg.objective.eps_low = 0.2, cfg.objective.eps_high = 0.28;
  cfg.normalizer = ulorl::global_normalizer(ulorl::agg_mode::seq_mean_token_mean, h.counts());
  if (kind == loss_kind::full) {
    cfg.kl_coef = 0.02;
    cfg.kl.estimator = ulorl::kl_estimator::k3;
    cfg.entropy_coef = 0.005;
    cfg.normalizer = ulorl::global_normalizer(ulorl::agg_mode::token_mean, h.counts());
  } else if (kind == loss_kind::gspo) {
    cfg.objective.kind = ulorl::objective_kind::gspo, cfg.objective.eps_low = 0.05, cfg.objective.eps_high = 0.08;
    cfg.kl_coef = 0.02;
    cfg.kl.estimator = ulorl::kl_estimator::k3;
  }
  return cfg;
}

const char* loss_name(loss_kind kind) {
  return kind == loss_kind::full ? "ppo, KL, entropy" : kind == loss_kind::seq_mean ? "ppo, seq mean" : "gspo, KL";
}

template <class T>
void compare(cublasHandle_t handle, cudaStream_t stream, ulorl_cuda_test::rng& g, const char* dtype, bool packed,
             std::int64_t hidden_size, std::int64_t vocab, std::int64_t chunk, int splits, loss_kind kind) {
  const bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  const float tau = 0.9f;
  const head_case h = packed ? make_case(g, 7, 11, true, hidden_size, vocab, bf16, tau)
                             : make_case(g, 3, 13, false, hidden_size, vocab, bf16, tau);
  const ulorl::policy_loss_config cfg = loss_config(h, kind);
  const auto n = static_cast<std::size_t>(h.tokens);
  std::vector<float> cgh(h.hidden.size()), cgw(h.weight.size()), clp(n), cent(n), clse(n);
  const ulorl::policy_loss_result c = ulorl_cuda_test::cpu_loss_from_hidden(
      h.hidden.data(), h.tokens, hidden_size, h.weight.data(), vocab, h.labels.data(), h.view(), cfg, tau,
      static_cast<std::size_t>(chunk > 0 ? chunk : 0), cgh.data(), cgw.data(), clp.data(), cent.data(), clse.data());
  const dev_case<T> d(h);
  uc::linear_head_launch_config opt;
  opt.chunk_rows = chunk;
  const run_out o = run_device<T>(handle, stream, h, d, cfg, tau, splits, opt);
  const std::string name = std::string(dtype) + (packed ? " packed" : " padded") + " N=" + std::to_string(h.tokens) +
                           " H=" + std::to_string(hidden_size) + " V=" + std::to_string(vocab) +
                           " chunk=" + std::to_string(chunk) + " splits=" + std::to_string(splits) + " (" +
                           loss_name(kind) + ")";
  int bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const bool ok =
        close(o.log_prob[i], clp[i], 5e-5) && close(o.entropy[i], cent[i], 5e-5) && close(o.lse[i], clse[i], 5e-5);
    if (!ok && bad++ < 3)
      std::printf("  %s token %zu: log_prob %.8g / %.8g, entropy %.8g / %.8g, lse %.8g / %.8g (device / cpu)\n",
                  name.c_str(), i, o.log_prob[i], clp[i], o.entropy[i], cent[i], o.lse[i], clse[i]);
  }
  const auto& a = o.res.metrics;
  const auto& b = c.metrics;
  const bool sums = o.err == cudaSuccess && o.status == 0 && o.bad_label_row == 0 && close(o.res.loss, c.loss, 1e-4) &&
                    close(o.res.pg_loss, c.pg_loss, 1e-4) && close(o.res.kl_loss, c.kl_loss, 1e-4) &&
                    close(o.res.entropy_loss, c.entropy_loss, 1e-4) && a.tokens == b.tokens &&
                    a.sequences == b.sequences && std::fabs(a.clipped - b.clipped) <= 1 &&
                    close(a.ratio_sum, b.ratio_sum, 1e-4) && close(a.kl_sum, b.kl_sum, 1e-4) &&
                    close(a.entropy_sum, b.entropy_sum, 1e-4);
  if (!sums) {
    ++bad;
    std::printf("  %s: %s, status %lld, bad label row %d\n", name.c_str(), cudaGetErrorName(o.err),
                static_cast<long long>(o.status), o.bad_label_row);
    std::printf("  %s: device loss %.10g pg %.10g kl %.10g ent %.10g clipped %g tokens %g\n", name.c_str(), o.res.loss,
                o.res.pg_loss, o.res.kl_loss, o.res.entropy_loss, a.clipped, a.tokens);
    std::printf("  %s: cpu    loss %.10g pg %.10g kl %.10g ent %.10g clipped %g tokens %g\n", name.c_str(), c.loss,
                c.pg_loss, c.kl_loss, c.entropy_loss, b.clipped, b.tokens);
  }
  // bf16: dZ is rounded to bf16 for the gradient GEMMs and grad_hidden is stored in bf16.
  const double tol = bf16 ? 1e-2 : 2e-4;
  const double eh = worst_relative(o.grad_hidden, cgh), ew = worst_relative(o.grad_weight, cgw);
  if (!(eh <= tol) || !(ew <= tol)) {
    ++bad;
    std::printf("  %s: worst relative difference grad_hidden %.3g, grad_weight %.3g (tolerance %.1g)\n", name.c_str(),
                eh, ew, tol);
  }
  if (bad) {
    ++failures;
    std::printf("FAIL %s\n", name.c_str());
  } else {
    std::printf("ok   %s: loss %.8g, grad_hidden %.2g, grad_weight %.2g\n", name.c_str(), o.res.loss, eh, ew);
  }
}

//! Two runs bitwise equal; grad_weight accumulation adds the same gradient again.
void determinism(cublasHandle_t handle, cudaStream_t stream, ulorl_cuda_test::rng& g) {
  const head_case h = make_case(g, 7, 11, true, 72, 1003, true, 1.0f);
  const dev_case<__nv_bfloat16> d(h);
  const ulorl::policy_loss_config cfg = loss_config(h, loss_kind::full);
  uc::linear_head_launch_config opt;
  opt.chunk_rows = 16;
  const run_out a = run_device<__nv_bfloat16>(handle, stream, h, d, cfg, 1.0f, 3, opt);
  const run_out b = run_device<__nv_bfloat16>(handle, stream, h, d, cfg, 1.0f, 3, opt);
  expect(a.err == cudaSuccess && std::memcmp(&a.res, &b.res, sizeof(a.res)) == 0 && a.grad_hidden == b.grad_hidden &&
             a.grad_weight == b.grad_weight,
         "determinism: two runs bitwise equal");
  opt.accumulate_grad_weight = true;
  const run_out c = run_device<__nv_bfloat16>(handle, stream, h, d, cfg, 1.0f, 3, opt, &a.grad_weight);
  std::vector<float> twice(a.grad_weight.size());
  for (std::size_t i = 0; i < twice.size(); ++i) twice[i] = 2.0f * a.grad_weight[i];
  const double e = worst_relative(c.grad_weight, twice);
  expect(c.err == cudaSuccess && e <= 1e-5 && c.grad_hidden == a.grad_hidden,
         "accumulate_grad_weight: the gradient added to the previous one (worst relative difference " +
             std::to_string(e) + ")");
}

//! A hook's error is returned; no tokens: zero sums and a zeroed grad_weight; an out-of-range label
//! is reported with its row in [0, N), and stops the loss.
void edges(cublasHandle_t handle, cudaStream_t stream, ulorl_cuda_test::rng& g) {
  head_case h = make_case(g, 3, 13, false, 64, 1000, false, 1.0f);
  const ulorl::policy_loss_config cfg = loss_config(h, loss_kind::full);
  uc::linear_head_launch_config opt;
  opt.chunk_rows = 16;
  {
    const dev_case<float> d(h);
    struct failing_hook {
      cudaError_t operator()(const uc::device_token_statistics&, cudaStream_t) const { return cudaErrorNotReady; }
    } hook;
    const run_out o = run_device<float>(handle, stream, h, d, cfg, 1.0f, 0, opt, nullptr, &hook);
    expect(o.err == cudaErrorNotReady, std::string("hook error returned: ") + cudaGetErrorName(o.err));
  }
  {
    head_case empty = h;
    empty.rows = 0, empty.tokens = 0;
    empty.hidden.clear(), empty.labels.clear(), empty.old.clear(), empty.adv.clear(), empty.mask.clear();
    empty.ref.clear(), empty.w.clear();
    const dev_case<float> d(empty);
    ulorl::policy_loss_config c0 = cfg;
    c0.normalizer = {ulorl::agg_mode::token_mean, 1.0, 1.0};
    const run_out o = run_device<float>(handle, stream, empty, d, c0, 1.0f, 0, opt);
    bool zeros = true;
    for (float x : o.grad_weight) zeros = zeros && x == 0.0f;
    expect(o.err == cudaSuccess && o.res.loss == 0.0 && o.status == 0 && zeros,
           "no tokens: zero loss, grad_weight zeroed");
  }
  {
    h.labels[20] = h.vocab;  // row 20: in the second chunk
    const dev_case<float> d(h);
    const run_out o = run_device<float>(handle, stream, h, d, cfg, 1.0f, 0, opt);
    expect(o.err == cudaSuccess && o.bad_label_row == 21 && o.status == 21 && std::isnan(o.res.loss) &&
               std::isnan(o.grad_weight[0]),
           "bad label: bad_label_row " + std::to_string(o.bad_label_row) + ", status " + std::to_string(o.status) +
               ", NaN loss and gradients");
  }
}

}  // namespace

int main() {
  validation();
  if (int rc = 0; !ulorl_cuda_test::gpu_after_validation("test_linear_head_cuda", rc)) return rc;
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    std::printf("FAIL cublasCreate\n");
    return 1;
  }
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreate(&stream));
  ulorl_cuda_test::rng g(4242);
  using L = loss_kind;
  //                                            packed   H     V  chunk splits  loss
  compare<float>(handle, stream, g, "float", false, 64, 1000, 16, 0, L::full);
  compare<float>(handle, stream, g, "float", true, 72, 1003, 16, 3, L::seq_mean);
  compare<float>(handle, stream, g, "float", false, 64, 1000, 0, 0, L::full);  // one chunk: no recomputation
  compare<float>(handle, stream, g, "float", true, 64, 1000, 8, 0, L::gspo);
  compare<__nv_bfloat16>(handle, stream, g, "bf16", false, 64, 1000, 16, 0, L::full);
  compare<__nv_bfloat16>(handle, stream, g, "bf16", true, 72, 1003, 16, 3, L::seq_mean);
  compare<__nv_bfloat16>(handle, stream, g, "bf16", true, 72, 1003, 5, 0, L::gspo);
  determinism(handle, stream, g);
  edges(handle, stream, g);
  CUDA_OK(cudaStreamDestroy(stream));
  cublasDestroy(handle);
  std::printf("%s\n", failures == 0 ? "test_linear_head_cuda: PASS" : "test_linear_head_cuda: FAIL");
  return failures == 0 ? 0 : 1;
}
