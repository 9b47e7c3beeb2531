// test_cases.hpp — what the CUDA comparison tests share: the failure count and `expect`, the step
// from the launchers' validation (no GPU needed) to the GPU comparisons, the counts of a mask in a
// padded or packed layout (for the step's normaliser), bf16 rounding of host values, and the
// relative comparison.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <ulorl/loss/aggregation.hpp>

namespace ulorl_cuda_test {

inline int failures = 0;

inline void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::printf("FAIL %s\n", what.c_str());
  }
}

//! After the launchers' validation: true when a GPU is there (and the validation launched nothing:
//! a kernel reading its host pointers would have faulted); false without one, `rc` then the test's
//! exit status (77, CTest's skip, when the validation passed).
inline bool gpu_after_validation(const char* test, int& rc) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("%s: validation %s; no CUDA device, the comparisons are skipped\n", test, failures == 0 ? "passed" : "FAILED");
    rc = failures == 0 ? 77 : 1;
    return false;
  }
  expect(cudaDeviceSynchronize() == cudaSuccess && cudaGetLastError() == cudaSuccess, "validation launched nothing");
  return true;
}

//! Rows, valid tokens and non-empty rows of `mask` (padded: row b at b * row_stride, cols tokens;
//! packed: offsets non-empty).
inline ulorl::batch_counts count_mask(std::int64_t rows, std::int64_t cols, std::int64_t row_stride,
                                      const std::vector<std::int64_t>& offsets, const std::vector<float>& mask) {
  ulorl::batch_counts k;
  k.rows = static_cast<double>(rows);
  for (std::int64_t b = 0; b < rows; ++b) {
    const std::int64_t lo = offsets.empty() ? b * row_stride : offsets[b];
    const std::int64_t n = offsets.empty() ? cols : offsets[b + 1] - offsets[b];
    double v = 0;
    for (std::int64_t t = 0; t < n; ++t) v += mask[lo + t];
    k.tokens += v, k.sequences += v > 0 ? 1.0 : 0.0;
  }
  return k;
}

//! x rounded to bf16 and back (what a bf16 input holds).
inline float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

//! |d - h| <= rel (1 + |h|), or both NaN.
inline bool close(double d, double h, double rel) {
  return std::fabs(d - h) <= rel * (1.0 + std::fabs(h)) || (std::isnan(d) && std::isnan(h));
}

}  // namespace ulorl_cuda_test
