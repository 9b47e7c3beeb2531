// The countdown task (examples/rlvr_trainer/task.hpp): prompt encoding, the verifier on hand-made
// responses, the warm-up answer generator, and the target distribution. Plain C++ (no torch).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <set>
#include <stdexcept>
#include <vector>

#include "catch.hpp"
#include "task.hpp"

using rlvr::countdown_task;
using rlvr::verdict;
using tokens = std::vector<std::int64_t>;

// The vocabulary as documented: remainder digits are 0..9, the step digit +d is 9 + d, EOS 19,
// BOS 20, PAD 21. Written out here rather than taken from the task's helpers.
namespace {
constexpr std::int64_t P1 = 10, P2 = 11, P3 = 12, P4 = 13, P9 = 18, EOS = 19, BOS = 20, PAD = 21;
}

TEST_CASE("prompt: BOS then the digits of S, least significant first", "[trainer][task]") {
  const countdown_task task;
  CHECK(task.prompt(407) == tokens{BOS, 7, 0, 4});
  CHECK(task.prompt(5) == tokens{BOS, 5, 0, 0});
  CHECK(task.prompt(999) == tokens{BOS, 9, 9, 9});
  CHECK_THROWS_AS(task.prompt(0), std::invalid_argument);
  CHECK_THROWS_AS(task.prompt(1000), std::invalid_argument);
}

TEST_CASE("verifier: correct traces", "[trainer][task]") {
  const countdown_task task;
  // 12 = 9 + 3: remainders 3, 0.
  CHECK(task.verify(12, tokens{P9, 3, 0, 0, P3, 0, 0, 0, EOS}) == verdict::correct);
  // 21 = 3 + 9 + 9: remainders 18, 9, 0 (borrow into the tens digit at the second step).
  CHECK(task.verify(21, tokens{P3, 8, 1, 0, P9, 9, 0, 0, P9, 0, 0, 0, EOS}) == verdict::correct);
  // 10 = 1 + 9: remainders 9, 0 (the tens digit borrows at the first step).
  CHECK(task.verify(10, tokens{P1, 9, 0, 0, P9, 0, 0, 0, EOS}) == verdict::correct);
  CHECK(task.verify(1, tokens{P1, 0, 0, 0, EOS}) == verdict::correct);
  CHECK(task.reward(12, tokens{P9, 3, 0, 0, P3, 0, 0, 0, EOS}) == 1.0);
}

TEST_CASE("verifier: a borrow through the hundreds digit", "[trainer][task]") {
  const countdown_task task;
  // 103 = 4 + 9 * 11: remainders 99, 90, 81, ..., 9, 0.
  tokens r{P4, 9, 9, 0};
  for (int rem = 90; rem >= 0; rem -= 9) {
    r.push_back(P9);
    r.push_back(rem % 10);
    r.push_back(rem / 10 % 10);
    r.push_back(rem / 100);
  }
  r.push_back(EOS);
  CHECK(task.verify(103, r) == verdict::correct);
  r[1] = 8;  // 103 - 4 written as 98
  CHECK(task.verify(103, r) == verdict::wrong_remainder);
}

TEST_CASE("verifier: wrong sum, wrong remainder", "[trainer][task]") {
  const countdown_task task;
  // Digits 9 + 2 = 11 != 12, remainders consistent with the digits.
  CHECK(task.verify(12, tokens{P9, 3, 0, 0, P2, 1, 0, 0, EOS}) == verdict::wrong_sum);
  // Overshoot: 9 + 9 = 18 > 12.
  CHECK(task.verify(12, tokens{P9, 3, 0, 0, P9, 4, 0, 0, EOS}) == verdict::wrong_sum);
  // Stopping immediately sums to 0.
  CHECK(task.verify(12, tokens{EOS}) == verdict::wrong_sum);
  // Digits sum to 12 but the first remainder says 4.
  CHECK(task.verify(12, tokens{P9, 4, 0, 0, P3, 0, 0, 0, EOS}) == verdict::wrong_remainder);
  // Digits sum to 12 but the final remainder is not written as 000.
  CHECK(task.verify(12, tokens{P9, 3, 0, 0, P3, 1, 0, 0, EOS}) == verdict::wrong_remainder);
  CHECK(task.reward(12, tokens{P9, 4, 0, 0, P3, 0, 0, 0, EOS}) == 0.0);
}

TEST_CASE("verifier: no stop is truncated (UloRL), also beyond L_max", "[trainer][task]") {
  const countdown_task task;
  CHECK(task.verify(12, tokens{P9, 3, 0, 0, P3, 0, 0, 0}) == verdict::truncated);
  CHECK(task.verify(12, tokens{}) == verdict::truncated);
  CHECK(task.verify(12, tokens{P9, 3, 0}) == verdict::truncated);
  // L_max = 9: 12 = 4 + 4 + 4 is a correct trace of 13 tokens, longer than the limit.
  const countdown_task short_task({.max_target = 18, .max_response_tokens = 9});
  CHECK(short_task.verify(12, tokens{P4, 8, 0, 0, P4, 4, 0, 0, P4, 0, 0, 0, EOS}) == verdict::truncated);
  // Exactly L_max tokens with EOS is fine.
  CHECK(short_task.verify(12, tokens{P9, 3, 0, 0, P3, 0, 0, 0, EOS}) == verdict::correct);
}

TEST_CASE("verifier: malformed responses", "[trainer][task]") {
  const countdown_task task;
  CHECK(task.verify(12, tokens{P9, 3, 0, 0, P3, 0, 0, 0, EOS, P1}) == verdict::malformed);  // after EOS
  CHECK(task.verify(12, tokens{P9, 3, 0, 0, P3, 0, 0, EOS}) == verdict::malformed);         // partial step
  CHECK(task.verify(12, tokens{P9, 3, 0, P1, P3, 0, 0, 0, EOS}) == verdict::malformed);     // step digit in a remainder
  CHECK(task.verify(12, tokens{3, P9, 0, 0, P3, 0, 0, 0, EOS}) == verdict::malformed);      // remainder digit as a step
  CHECK(task.verify(12, tokens{P9, 3, 0, BOS, P3, 0, 0, 0, EOS}) == verdict::malformed);
  CHECK(task.verify(12, tokens{P9, 3, 0, 0, PAD, 0, 0, 0, EOS}) == verdict::malformed);
  CHECK(task.verify(12, tokens{EOS, EOS}) == verdict::malformed);
  CHECK_THROWS_AS(task.verify(0, tokens{EOS}), std::invalid_argument);
}

TEST_CASE("random answers are correct, fit L_max and vary", "[trainer][task]") {
  const countdown_task task({.max_response_tokens = 1024, .seed = 3});
  rlvr::sequential_rng rng(11);
  std::printf("random answers: seed 11\n");
  for (std::uint64_t k = 0; k < 3000; ++k) {
    const auto s = task.training_target(k);
    const auto a = task.random_answer(s, rng);
    INFO("target " << s << " length " << a.size());
    REQUIRE(task.verify(s, a) == verdict::correct);
    REQUIRE(a.size() <= 1024);
    REQUIRE(a.size() % 4 == 1);
  }
  std::set<tokens> distinct;
  for (int i = 0; i < 50; ++i) distinct.insert(task.random_answer(30, rng));
  CHECK(distinct.size() > 40);  // 30 has tens of millions of compositions into parts <= 9
  // A limit that the average random answer exceeds falls back to the shortest answer (nines).
  const countdown_task tight({.max_target = 999, .max_response_tokens = 449});
  const auto a = tight.random_answer(999, rng);
  CHECK(tight.verify(999, a) == verdict::correct);
  CHECK(a.size() == 4 * 111 + 1);
  CHECK_THROWS_AS(countdown_task({.max_target = 999, .max_response_tokens = 444}), std::invalid_argument);
}

TEST_CASE("targets: held-out split and the log-uniform law", "[trainer][task]") {
  const countdown_task task({.seed = 5});
  std::int64_t held = 0;
  for (std::int64_t s = 1; s <= 999; ++s) {
    if (s < 10) CHECK_FALSE(task.held_out(s));
    held += task.held_out(s) ? 1 : 0;
  }
  CHECK(held == task.held_out_count());
  CHECK(held > 60);   // 990 values at 10%: mean 99, sd 9.4
  CHECK(held < 140);
  for (const auto s : task.validation_targets(200)) CHECK(task.held_out(s));

  // Expected P(S <= 31) under P(s) ~ log((s + 1) / s) over the training values, by summation.
  double mass = 0, low = 0;
  for (std::int64_t s = 1; s <= 999; ++s) {
    if (task.held_out(s)) continue;
    const double p = std::log(static_cast<double>(s + 1) / static_cast<double>(s));
    mass += p;
    if (s <= 31) low += p;
  }
  const double expect = low / mass;
  const int n = 20000;
  int below = 0;
  for (int k = 0; k < n; ++k) {
    const auto s = task.training_target(static_cast<std::uint64_t>(k));
    REQUIRE_FALSE(task.held_out(s));
    REQUIRE(s >= 1);
    REQUIRE(s <= 999);
    below += s <= 31 ? 1 : 0;
  }
  const double sd = std::sqrt(expect * (1 - expect) / n);
  CHECK(std::abs(below / static_cast<double>(n) - expect) < 4 * sd);

  // A pure function of (seed, key).
  const countdown_task same({.seed = 5}), other({.seed = 6});
  int differ = 0;
  for (std::uint64_t k = 0; k < 100; ++k) {
    CHECK(same.training_target(k) == task.training_target(k));
    differ += other.training_target(k) != task.training_target(k) ? 1 : 0;
  }
  CHECK(differ > 50);
}
