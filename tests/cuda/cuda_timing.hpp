// cuda_timing.hpp — the CUDA benchmarks' timer: the mean time of `reps` calls on the default stream
// after one warm-up call, by CUDA events.
#pragma once

#include <cuda_runtime.h>

#include "cuda_check.hpp"

namespace ulorl_cuda_test {

template <class F>
float time_ms(F&& f, int reps) {
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  f();  // warm-up
  CUDA_OK(cudaEventRecord(a));
  for (int i = 0; i < reps; ++i) f();
  CUDA_OK(cudaEventRecord(b));
  CUDA_OK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, a, b));
  CUDA_OK(cudaEventDestroy(a));
  CUDA_OK(cudaEventDestroy(b));
  return ms / static_cast<float>(reps);
}

}  // namespace ulorl_cuda_test
