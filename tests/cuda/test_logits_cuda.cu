// test_logits_cuda — the CUDA logits kernels (ulorl/kernels/logits.cuh) against the CPU kernels
// (ulorl/logits.hpp) on the same bf16 / fp16 / fp32 values: one-block and split-vocabulary forward,
// aligned (16-byte vector) and unaligned (scalar) rows, -inf entries, temperature, in-place backward,
// device-side label errors. Argument validation is checked first and needs no GPU; without a GPU the
// rest is skipped with a message and exit code 77 (CTest SKIP_RETURN_CODE).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include <ulorl/kernels/logits.cuh>

#include "cpu_reference.hpp"
#include "cuda_check.hpp"
#include "test_rng.hpp"

namespace {

int failures = 0;
#define EXPECT(cond)                                                       \
  do {                                                                     \
    if (!(cond)) {                                                         \
      ++failures;                                                          \
      std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);          \
    }                                                                      \
  } while (0)

using ulorl::cuda::detail::from_float;
using ulorl::cuda::detail::to_float;
template <class T>
const char* name() {
  if constexpr (std::is_same_v<T, float>)
    return "fp32";
  else if constexpr (std::is_same_v<T, __half>)
    return "fp16";
  else
    return "bf16";
}

template <class T>
struct dev {
  T* p = nullptr;
  explicit dev(std::size_t n) { CUDA_OK(cudaMalloc(&p, (n ? n : 1) * sizeof(T))); }
  ~dev() { cudaFree(p); }
  dev(const dev&) = delete;
  dev& operator=(const dev&) = delete;
};

// C++17 (CUDA 11.8): no designated initializers.
ulorl::cuda::logits_config make_config(float temperature, int splits, int* bad_label_row = nullptr) {
  ulorl::cuda::logits_config c;
  c.temperature = temperature, c.splits = splits, c.bad_label_row = bad_label_row;
  return c;
}

void validation_without_gpu() {
  using namespace ulorl::cuda;
  // Fake, never dereferenced device pointers: validation happens before any CUDA call.
  auto* x = reinterpret_cast<const __nv_bfloat16*>(std::uintptr_t{0x10000});
  auto* y = reinterpret_cast<const std::int64_t*>(std::uintptr_t{0x20000});
  auto* out = reinterpret_cast<float*>(std::uintptr_t{0x30000});
  std::size_t bytes = 0;
  const logits_config one = make_config(1.f, 1);
  EXPECT(logits_forward(nullptr, bytes, x, 4, 10, 10, y, out, out, out, one) == cudaSuccess && bytes == 0);
  EXPECT(logits_forward(nullptr, bytes, x, 4, 0, 0, y, out, out, out, one) == cudaErrorInvalidValue);  // V = 0
  EXPECT(logits_forward(nullptr, bytes, x, 4, 10, 9, y, out, out, out, one) == cudaErrorInvalidValue);  // rows overlap
  EXPECT(logits_forward(nullptr, bytes, x, -1, 10, 10, y, out, out, out, one) == cudaErrorInvalidValue);
  EXPECT(logits_forward(nullptr, bytes, static_cast<const __nv_bfloat16*>(nullptr), 4, 10, 10, y, out, out, out, one) ==
         cudaErrorInvalidValue);
  EXPECT(logits_forward(nullptr, bytes, x, 4, 10, 10, nullptr, out, out, out, one) == cudaErrorInvalidValue);
  EXPECT(logits_forward(nullptr, bytes, reinterpret_cast<const __nv_bfloat16*>(std::uintptr_t{0x10001}), 4, 10, 10, y,
                        out, out, out, one) == cudaErrorInvalidValue);  // misaligned element pointer
  EXPECT(logits_forward(nullptr, bytes, x, 4, 10, 10, y, out, out, out, make_config(0.f, 1)) ==
         cudaErrorInvalidValue);
  EXPECT(logits_forward(nullptr, bytes, x, 4, 10, 10, y, out, out, out, make_config(NAN, 1)) ==
         cudaErrorInvalidValue);
  const logits_config four = make_config(1.f, 4);
  EXPECT(logits_forward(nullptr, bytes, x, 4, 1000, 1000, y, out, out, out, four) == cudaSuccess &&
         bytes == 4 * 4 * sizeof(ulorl::softmax_partial<float>));
  std::size_t small = bytes - 1;
  EXPECT(logits_forward(reinterpret_cast<void*>(std::uintptr_t{0x40000}), small, x, 4, 1000, 1000, y, out, out, out,
                        four) == cudaErrorInvalidValue);  // workspace too small
  EXPECT(logits_forward(reinterpret_cast<void*>(std::uintptr_t{0x40000}), bytes, x, 4, 1000, 1000, y,
                        static_cast<float*>(nullptr), out, out, four) == cudaErrorInvalidValue);  // log_prob required
  auto* g = reinterpret_cast<__nv_bfloat16*>(std::uintptr_t{0x50000});
  EXPECT(logits_backward(x, 4, 10, 10, y, static_cast<const float*>(nullptr), out, out, out, g, 10, one) ==
         cudaErrorInvalidValue);
  EXPECT(logits_backward(x, 4, 10, 10, y, out, static_cast<const float*>(nullptr), out, out, g, 10, one) ==
         cudaErrorInvalidValue);  // grad_entropy without entropy
  EXPECT(logits_backward(x, 4, 10, 10, y, out, out, out, out, g, 9, one) == cudaErrorInvalidValue);
  EXPECT(logits_backward(x, 4, 10, 10, y, out, out, out, out, const_cast<__nv_bfloat16*>(x), 12, one) ==
         cudaErrorInvalidValue);  // in place with another stride
}

struct case_t {
  std::int64_t rows, cols, pad;
  int splits;
  float tau;
};

template <class T>
void compare(const case_t& c, ulorl_cuda_test::rng& rng) {
  const std::int64_t stride = c.cols + c.pad;
  std::vector<T> h(static_cast<std::size_t>(c.rows * stride), from_float<T>(0.f));
  std::vector<float> hf(static_cast<std::size_t>(c.rows * c.cols));
  auto nd = [&rng] { return static_cast<float>(rng.normal(0.0, 3.0)); };
  auto u = [&rng] { return static_cast<float>(rng.uniform()); };
  std::vector<std::int64_t> labels(static_cast<std::size_t>(c.rows));
  for (std::int64_t r = 0; r < c.rows; ++r) {
    labels[r] = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(c.cols));
    for (std::int64_t j = 0; j < c.cols; ++j) {
      float v = (u() < 0.1f && j != labels[r]) ? -INFINITY : nd() + 20.f;
      const T t = from_float<T>(v);
      h[r * stride + j] = t;
      hf[r * c.cols + j] = to_float(t);  // the CPU reference sees exactly the stored values
    }
  }
  std::vector<double> glp(c.rows), gent(c.rows);
  for (auto& v : glp) v = nd();
  for (auto& v : gent) v = nd() / 3;
  // CPU reference (ulorl/logits.hpp, double statistics), built by the host compiler in C++20.
  const auto n = static_cast<std::size_t>(c.rows), v = static_cast<std::size_t>(c.cols);
  std::vector<double> lp(n), ent(n), lse(n);
  std::vector<float> gref(n * v);
  ulorl_cuda_test::cpu_logits(hf.data(), n, v, labels.data(), c.tau, glp.data(), gent.data(), lp.data(), ent.data(),
                              lse.data(), gref.data());
  // GPU.
  dev<T> dx(h.size()), dg(h.size());
  dev<std::int64_t> dy(n);
  dev<float> dlp(n), dent(n), dlse(n), dglp(n), dgent(n);
  dev<int> dbad(1);
  std::vector<float> glpf(glp.begin(), glp.end()), gentf(gent.begin(), gent.end());
  CUDA_OK(cudaMemcpy(dx.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dy.p, labels.data(), n * sizeof(std::int64_t), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dglp.p, glpf.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dgent.p, gentf.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dbad.p, 0, sizeof(int)));
  const ulorl::cuda::logits_config gcfg = make_config(c.tau, c.splits, dbad.p);
  std::size_t bytes = 0;
  CUDA_OK(ulorl::cuda::logits_forward(nullptr, bytes, dx.p, c.rows, c.cols, stride, dy.p, dlp.p, dent.p, dlse.p, gcfg));
  dev<unsigned char> ws(bytes);
  CUDA_OK(ulorl::cuda::logits_forward(ws.p, bytes, dx.p, c.rows, c.cols, stride, dy.p, dlp.p, dent.p, dlse.p, gcfg));
  CUDA_OK(ulorl::cuda::logits_backward(dx.p, c.rows, c.cols, stride, dy.p, dlse.p, dent.p, dglp.p, dgent.p, dg.p, stride,
                                       gcfg));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> glp_out(n), ent_out(n), lse_out(n);
  std::vector<T> g_out(h.size());
  CUDA_OK(cudaMemcpy(glp_out.data(), dlp.p, n * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(ent_out.data(), dent.p, n * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(lse_out.data(), dlse.p, n * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(g_out.data(), dg.p, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
  int bad = -1;
  CUDA_OK(cudaMemcpy(&bad, dbad.p, sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT(bad == 0);
  double e_stat = 0, e_grad = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const auto unit = [](double a, double b) { return std::fabs(a - b) / std::max(1.0, std::fabs(b)); };
    e_stat = std::max({e_stat, unit(glp_out[r], lp[r]), unit(ent_out[r], ent[r]), unit(lse_out[r], lse[r])});
    double gmax = 0, emax = 0;
    for (std::size_t j = 0; j < v; ++j) {
      gmax = std::max(gmax, std::fabs(static_cast<double>(gref[r * v + j])));
      emax = std::max(emax, std::fabs(static_cast<double>(to_float(g_out[r * stride + j])) - gref[r * v + j]));
    }
    e_grad = std::max(e_grad, emax / std::max(gmax, 1e-30));
  }
  // fp32: float accumulation on the GPU; fp16/bf16: the gradient is stored in the logits' type.
  const double grad_tol = std::is_same_v<T, float> ? 1e-5 : std::is_same_v<T, __half> ? 2e-3 : 1e-2;
  std::printf("  %s rows=%lld V=%lld pad=%lld splits=%d tau=%.2f: stats err %.2e, grad normwise err %.2e\n", name<T>(),
              static_cast<long long>(c.rows), static_cast<long long>(c.cols), static_cast<long long>(c.pad), c.splits,
              c.tau, e_stat, e_grad);
  EXPECT(e_stat < 5e-5);  // fp32 per-thread sums of ~600 terms: typically ~2e-6
  EXPECT(e_grad < grad_tol);

  // In place: the gradient overwrites the logits and equals the out-of-place result.
  CUDA_OK(ulorl::cuda::logits_backward(dx.p, c.rows, c.cols, stride, dy.p, dlse.p, dent.p, dglp.p, dgent.p, dx.p, stride,
                                       gcfg));
  std::vector<T> g_in(h.size());
  CUDA_OK(cudaMemcpy(g_in.data(), dx.p, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
  bool same = true;
  for (std::int64_t r = 0; r < c.rows; ++r)
    for (std::int64_t j = 0; j < c.cols; ++j) same = same && to_float(g_in[r * stride + j]) == to_float(g_out[r * stride + j]);
  EXPECT(same);
}

template <class T>
void bad_label() {
  const std::int64_t rows = 3, cols = 100;
  std::vector<T> h(rows * cols, from_float<T>(1.f));
  std::vector<std::int64_t> labels{5, 100, -1};
  dev<T> dx(h.size());
  dev<std::int64_t> dy(3);
  dev<float> out(9);
  dev<int> dbad(1);
  CUDA_OK(cudaMemcpy(dx.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dy.p, labels.data(), 3 * sizeof(std::int64_t), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dbad.p, 0, sizeof(int)));
  std::size_t bytes = 0;
  const ulorl::cuda::logits_config cfg = make_config(1.f, 1, dbad.p);
  CUDA_OK(ulorl::cuda::logits_forward(nullptr, bytes, dx.p, rows, cols, cols, dy.p, out.p, out.p + 3, out.p + 6, cfg));
  CUDA_OK(ulorl::cuda::logits_forward(out.p, bytes, dx.p, rows, cols, cols, dy.p, out.p, out.p + 3, out.p + 6, cfg));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> o(9);
  int bad = 0;
  CUDA_OK(cudaMemcpy(o.data(), out.p, 9 * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&bad, dbad.p, sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT(std::fabs(o[0] + std::log(100.f)) < 1e-5f);
  EXPECT(std::isnan(o[1]) && std::isnan(o[2]));
  EXPECT(bad == 2 || bad == 3);  // first row to report: row 1 or row 2 (+ 1)
}

}  // namespace

int main() {
  validation_without_gpu();
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("SKIP test_logits_cuda: no CUDA device (cudaGetDeviceCount: %s); argument validation checked: %s\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices", failures ? "FAILED" : "ok");
    return failures ? 1 : 77;
  }
  ulorl_cuda_test::rng rng(31337);
  std::printf("test_logits_cuda seed 31337\n");
  const case_t cases[] = {{1, 1, 0, 1, 1.f},      {3, 7, 0, 0, 1.f},        {5, 1000, 0, 1, 0.7f},
                          {5, 1000, 3, 0, 0.7f},  {4, 1000, 0, 7, 1.3f},    {2, 151936, 0, 0, 1.f},
                          {2, 151936, 8, 1, 1.f}, {2, 151936, 5, 13, 0.6f}, {64, 32000, 0, 0, 1.f}};
  for (const auto& c : cases) {
    compare<float>(c, rng);
    compare<__half>(c, rng);
    compare<__nv_bfloat16>(c, rng);
  }
  bad_label<float>();
  bad_label<__nv_bfloat16>();
  std::printf("test_logits_cuda: %s (%d failures)\n", failures ? "FAILED" : "passed", failures);
  return failures ? 1 : 0;
}
