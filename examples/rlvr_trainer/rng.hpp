// rng.hpp — the random numbers of the example trainer: counter-based, so that a value depends only
// on what it is for (seed, stream, sequence, token index), never on call order.
//
// The decoding engine samples token i of sequence s from the uniform counter_uniform(seed, stream,
// s, i). A sequence therefore draws the same numbers whether it is decoded alone or in a batch,
// in one piece or paused and resumed: batching and segmenting cannot change what is sampled, only
// the weights can. Prompts are drawn the same way from their group id.
#pragma once

#include <cstdint>

namespace rlvr {

//! splitmix64's finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mix.
[[nodiscard]] constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

//! A 64-bit hash of a tuple of counters (each mixed in turn, so the order matters).
[[nodiscard]] constexpr std::uint64_t counter_hash(std::uint64_t seed, std::uint64_t a, std::uint64_t b = 0,
                                                   std::uint64_t c = 0) noexcept {
  return splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b) ^ c);
}

//! The top 53 bits of `x` as a double in the open interval (0, 1).
[[nodiscard]] constexpr double unit_interval(std::uint64_t x) noexcept {
  return (static_cast<double>(x >> 11) + 0.5) * 0x1.0p-53;
}

//! A uniform number in (0, 1) that is a pure function of its counters.
[[nodiscard]] constexpr double counter_uniform(std::uint64_t seed, std::uint64_t a, std::uint64_t b = 0,
                                               std::uint64_t c = 0) noexcept {
  return unit_interval(counter_hash(seed, a, b, c));
}

//! A small sequential generator (for warm-up data): state advances by one counter per draw.
class sequential_rng {
 public:
  explicit constexpr sequential_rng(std::uint64_t seed) noexcept : seed_(seed) {}
  [[nodiscard]] constexpr std::uint64_t next_u64() noexcept { return counter_hash(seed_, counter_++); }
  [[nodiscard]] constexpr double uniform() noexcept { return unit_interval(next_u64()); }
  //! Uniform integer in [0, n), n >= 1 (modulo bias below n / 2^64, irrelevant for small n).
  [[nodiscard]] constexpr std::uint64_t below(std::uint64_t n) noexcept { return next_u64() % n; }

 private:
  std::uint64_t seed_;
  std::uint64_t counter_ = 0;
};

}  // namespace rlvr
