// test_rng.hpp — a small deterministic generator for the CUDA tests and benchmarks. nvcc 11.8
// cannot parse libstdc++ 12's <random> (its __int128 declaration), so the .cu files do not include it.
#pragma once

#include <cmath>
#include <cstdint>

namespace ulorl_cuda_test {

//! splitmix64: uniform 64-bit words, uniform floats in [0, 1), normals by Box-Muller.
class rng {
 public:
  explicit rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t operator()() {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  //! Uniform in [0, 1).
  double uniform() { return static_cast<double>((*this)() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  double normal(double mean, double sd) {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return mean + sd * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  std::uint64_t s_;
};

}  // namespace ulorl_cuda_test
