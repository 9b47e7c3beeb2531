// device_buffer.hpp — the CUDA tests' device arrays: cudaMalloc'd on construction (at least one
// element), freed on destruction, copied whole to and from host vectors.
#pragma once

#include <cstddef>
#include <vector>

#include <cuda_runtime.h>

#include "cuda_check.hpp"

namespace ulorl_cuda_test {

template <class T>
struct dev {
  T* p = nullptr;
  std::size_t n = 0;
  dev() = default;
  explicit dev(std::size_t count) : n(count) { CUDA_OK(cudaMalloc(&p, (count > 0 ? count : 1) * sizeof(T))); }
  dev(const dev&) = delete;
  dev& operator=(const dev&) = delete;
  ~dev() { cudaFree(p); }
  void put(const std::vector<T>& h) { CUDA_OK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    CUDA_OK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

}  // namespace ulorl_cuda_test
