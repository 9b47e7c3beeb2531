// task.hpp — the verifiable task of the example trainer: "count down from S".
//
// Prompt: a target S in [1, 999]. Response: a trace of steps, each a digit d in 1..9 followed by the
// remainder r - d written with three digit tokens, starting from r = S; the answer is complete when
// the remainder reaches 000, and the response then ends with EOS:
//
//     prompt    BOS  u(S) t(S) h(S)                        (remainder digits, least significant first)
//     response  +d1 u(r1) t(r1) h(r1)  +d2 u(r2) ...  +dk 0 0 0  EOS      r_i = r_(i-1) - d_i,  r_k = 0
//
// The reward is 1 exactly when the trace is well formed, its digits sum to S and every written
// remainder is right; a response without EOS within L_max tokens is truncated and incorrect (UloRL).
//
// Why this task and not the bare "write digits that sum to S":
//  * many correct answers: every composition of S into parts of 1..9 (2^(S-1) for S <= 9, far more
//    beyond), of very different lengths, so the responses of one prompt differ in length as
//    reasoning traces do;
//  * every step is a local computation (subtract one digit from the remainder written four tokens
//    earlier, with a borrow), which a 2-4 layer transformer with rotary positions learns in minutes,
//    whereas an exact running sum over hundreds of tokens is a counting problem small transformers
//    learn poorly. Remainders are written least significant digit first so that the borrow flows in
//    generation order (the usual trick for arithmetic in transformers);
//  * a long tail of lengths: S is log-uniform (P(S) ~ 1/S, median 31), and a trace takes 4 tokens
//    per digit, so correct answers range from 5 tokens (S <= 9 in one step) to several hundred
//    (S near 999 with average digits); a policy that prefers small digits truncates at L_max, a
//    policy that learns to take large steps on large targets does not.
// Targets >= 10 are split by a hash into training and held-out validation values (targets below 10
// are single-step patterns and all train), so validation measures generalisation to unseen targets.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "rng.hpp"

namespace rlvr {

//! Why a response earned its reward (the first failing check, in this order).
enum class verdict : std::uint8_t {
  correct,          //!< well formed, digits sum to S, every remainder right, EOS
  truncated,        //!< no EOS within max_response_tokens (UloRL: incorrect)
  malformed,        //!< a token of the wrong kind or place (tokens after EOS, a partial step, BOS/PAD)
  wrong_sum,        //!< well formed but the digits do not sum to S
  wrong_remainder,  //!< the digits sum to S but a written remainder is wrong
};

[[nodiscard]] constexpr const char* to_string(verdict v) noexcept {
  switch (v) {
    case verdict::correct: return "correct";
    case verdict::truncated: return "truncated";
    case verdict::malformed: return "malformed";
    case verdict::wrong_sum: return "wrong_sum";
    case verdict::wrong_remainder: return "wrong_remainder";
  }
  return "unknown";
}

struct countdown_config {
  std::int64_t max_target = 999;            //!< S in [1, max_target]; remainders have 3 digits
  std::int64_t min_target = 1;              //!< training and validation targets are drawn from [min_target, max_target]
  std::int64_t max_response_tokens = 1024;  //!< L_max: longer responses are truncated
  double validation_fraction = 0.1;         //!< share of the targets >= 10 held out for validation
  std::uint64_t seed = 1;                   //!< selects the held-out targets and the prompt draws
};

class countdown_task {
 public:
  // Vocabulary: remainder digits 0..9, step digits +1..+9, EOS, BOS, PAD.
  static constexpr std::int64_t eos_token = 19;
  static constexpr std::int64_t bos_token = 20;
  static constexpr std::int64_t pad_token = 21;
  static constexpr std::int64_t vocab_size = 22;
  static constexpr std::int64_t prompt_tokens = 4;  //!< BOS + three digits of S
  static constexpr std::int64_t step_tokens = 4;    //!< +d and three remainder digits
  static constexpr std::int64_t remainder_digits = 3;

  [[nodiscard]] static constexpr std::int64_t remainder_token(std::int64_t digit) noexcept { return digit; }
  [[nodiscard]] static constexpr std::int64_t step_token(std::int64_t d) noexcept { return 9 + d; }
  [[nodiscard]] static constexpr bool is_remainder_token(std::int64_t t) noexcept { return t >= 0 && t <= 9; }
  [[nodiscard]] static constexpr bool is_step_token(std::int64_t t) noexcept { return t >= 10 && t <= 18; }
  //! Tokens of a correct answer with `steps` steps (EOS included).
  [[nodiscard]] static constexpr std::int64_t answer_tokens(std::int64_t steps) noexcept {
    return steps * step_tokens + 1;
  }

  explicit countdown_task(const countdown_config& config = {}) : c_(config) {
    if (c_.max_target < 1 || c_.max_target > 999)
      throw std::invalid_argument("countdown_task: max_target must be in [1, 999], got " + std::to_string(c_.max_target));
    if (c_.min_target < 1 || c_.min_target > c_.max_target)
      throw std::invalid_argument("countdown_task: min_target must be in [1, max_target], got " + std::to_string(c_.min_target));
    const std::int64_t shortest = answer_tokens((c_.max_target + 8) / 9);
    if (c_.max_response_tokens < shortest)
      throw std::invalid_argument("countdown_task: max_response_tokens " + std::to_string(c_.max_response_tokens) +
                                  " cannot hold the shortest answer for max_target (" + std::to_string(shortest) +
                                  " tokens)");
    if (!(c_.validation_fraction >= 0.0 && c_.validation_fraction < 1.0))
      throw std::invalid_argument("countdown_task: validation_fraction must be in [0, 1)");
    for (std::int64_t s = c_.min_target; s <= c_.max_target; ++s) held_out_count_ += held_out(s) ? 1 : 0;
    if (held_out_count_ == c_.max_target - c_.min_target + 1)
      throw std::invalid_argument("countdown_task: every target of [min_target, max_target] is held out");
  }

  [[nodiscard]] const countdown_config& config() const noexcept { return c_; }
  [[nodiscard]] std::int64_t max_response_tokens() const noexcept { return c_.max_response_tokens; }
  //! Number of distinct held-out targets in [min_target, max_target].
  [[nodiscard]] std::int64_t held_out_count() const noexcept { return held_out_count_; }
  //! Longest prompt + response a policy must hold.
  [[nodiscard]] std::int64_t max_sequence_tokens() const noexcept { return prompt_tokens + c_.max_response_tokens; }

  //! BOS followed by the digits of S, least significant first.
  [[nodiscard]] std::vector<std::int64_t> prompt(std::int64_t target) const {
    check_target("countdown_task::prompt", target);
    std::vector<std::int64_t> p{bos_token};
    append_remainder(p, target);
    return p;
  }

  //! Whether a target belongs to the held-out validation values.
  [[nodiscard]] bool held_out(std::int64_t target) const noexcept {
    if (target < 10) return false;
    return unit_interval(counter_hash(c_.seed, 0x4E1D0u, static_cast<std::uint64_t>(target))) < c_.validation_fraction;
  }

  //! The training target for a key (a group id): log-uniform on [min_target, max_target], never held out.
  //! A pure function of (seed, key), so every run and segment count sees the same prompts.
  [[nodiscard]] std::int64_t training_target(std::uint64_t key) const noexcept { return draw(0x7A1Bu, key, false); }

  //! `n` validation targets: log-uniform like training, restricted to the held-out values.
  [[nodiscard]] std::vector<std::int64_t> validation_targets(std::int64_t n) const {
    if (held_out_count_ == 0) throw std::invalid_argument("countdown_task::validation_targets: no target is held out");
    std::vector<std::int64_t> out;
    for (std::int64_t i = 0; i < n; ++i) out.push_back(draw(0x5A11Du, static_cast<std::uint64_t>(i), true));
    return out;
  }

  //! Checks a response (the tokens after the prompt) for target S.
  [[nodiscard]] verdict verify(std::int64_t target, std::span<const std::int64_t> response) const {
    check_target("countdown_task::verify", target);
    const auto eos = std::find(response.begin(), response.end(), eos_token);
    if (eos == response.end() || static_cast<std::int64_t>(response.size()) > c_.max_response_tokens)
      return verdict::truncated;
    if (eos + 1 != response.end()) return verdict::malformed;
    const auto body = response.first(static_cast<std::size_t>(eos - response.begin()));
    if (body.size() % step_tokens != 0) return verdict::malformed;
    std::int64_t sum = 0;
    for (std::size_t i = 0; i < body.size(); i += step_tokens) {
      if (!is_step_token(body[i])) return verdict::malformed;
      for (std::size_t j = 1; j < step_tokens; ++j)
        if (!is_remainder_token(body[i + j])) return verdict::malformed;
      sum += body[i] - 9;
    }
    if (sum != target) return verdict::wrong_sum;
    std::int64_t r = target;
    for (std::size_t i = 0; i < body.size(); i += step_tokens) {
      r -= body[i] - 9;
      const std::int64_t written = body[i + 1] + 10 * body[i + 2] + 100 * body[i + 3];
      if (written != r) return verdict::wrong_remainder;
    }
    return verdict::correct;
  }

  //! 1 for a correct response, else 0.
  [[nodiscard]] double reward(std::int64_t target, std::span<const std::int64_t> response) const {
    return verify(target, response) == verdict::correct ? 1.0 : 0.0;
  }

  //! A random correct answer (supervised warm-up data): each digit uniform on 1..min(9, r). Redrawn
  //! when it would not fit in max_response_tokens; after 64 misses the shortest answer (nines) is
  //! returned, which the constructor checked fits.
  [[nodiscard]] std::vector<std::int64_t> random_answer(std::int64_t target, sequential_rng& rng) const {
    check_target("countdown_task::random_answer", target);
    std::vector<std::int64_t> out;
    for (int attempt = 0; attempt < 64; ++attempt) {
      out.clear();
      for (std::int64_t r = target; r > 0;) {
        const auto d = 1 + static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(std::min<std::int64_t>(9, r))));
        r -= d;
        out.push_back(step_token(d));
        append_remainder(out, r);
      }
      out.push_back(eos_token);
      if (static_cast<std::int64_t>(out.size()) <= c_.max_response_tokens) return out;
    }
    out.clear();
    for (std::int64_t r = target; r > 0;) {
      const std::int64_t d = std::min<std::int64_t>(9, r);
      r -= d;
      out.push_back(step_token(d));
      append_remainder(out, r);
    }
    out.push_back(eos_token);
    return out;
  }

  //! Appends the three remainder digits of r (0 <= r <= 999), least significant first.
  static void append_remainder(std::vector<std::int64_t>& out, std::int64_t r) {
    for (std::int64_t j = 0; j < remainder_digits; ++j, r /= 10) out.push_back(remainder_token(r % 10));
  }

 private:
  void check_target(const char* fn, std::int64_t target) const {
    if (target < 1 || target > c_.max_target)
      throw std::invalid_argument(std::string(fn) + ": target " + std::to_string(target) + " outside [1, " +
                                  std::to_string(c_.max_target) + "]");
  }
  // Log-uniform on [lo, hi] = [min_target, max_target] (P(S = s) = log((s + 1) / s) / log((hi + 1) / lo)),
  // redrawn until the target is (or is not) held out.
  [[nodiscard]] std::int64_t draw(std::uint64_t salt, std::uint64_t key, bool want_held_out) const noexcept {
    const double log_lo = std::log(static_cast<double>(c_.min_target));
    const double log_span = std::log(static_cast<double>(c_.max_target) + 1.0) - log_lo;
    for (std::uint64_t attempt = 0;; ++attempt) {
      const double u = counter_uniform(c_.seed, salt, key, attempt);
      const auto s = std::clamp<std::int64_t>(static_cast<std::int64_t>(std::exp(log_lo + u * log_span)), c_.min_target,
                                              c_.max_target);
      if (held_out(s) == want_held_out) return s;
    }
  }

  countdown_config c_;
  std::int64_t held_out_count_ = 0;
};

}  // namespace rlvr
