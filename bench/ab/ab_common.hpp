// bench/ab/ab_common.hpp — what the two sides of an A/B benchmark share: the input arrays (generated
// once, in ab_data.cpp, and read by both sides: same bytes, same addresses), the side's namespace
// and name, and the table of cases each side fills for the driver (ab_main.cpp).
//
// This header must not include any ulorl header: it is compiled into both sides (ab_*_cases.cpp,
// once against the current headers and once against the baseline's) and into the side-independent
// objects (ab_main.cpp, ab_data.cpp). Everything here is plain data and standard templates over it,
// identical on both sides, so the inline definitions that merge at link time are the same code; a
// side's callables are lambdas in its own anonymous namespace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#define AB_CAT2(a, b) a##b
#define AB_CAT(a, b) AB_CAT2(a, b)
#define AB_STR2(x) #x
#define AB_STR(x) AB_STR2(x)

#if defined(AB_SIDE)
//! The side's namespace (`new` is a keyword: ab::side_new, ab::side_old) and its name in the
//! benchmark names ("loss/<case>/new").
#define AB_SIDE_NS AB_CAT(side_, AB_SIDE)
#define AB_SIDE_NAME AB_STR(AB_SIDE)
#endif

namespace ab {

// ---- policy loss: B rows of 8192 tokens, ragged masks (bench/bench_loss.cpp's data) ----------------
inline constexpr std::size_t loss_row_len = 8192;

template <class T>
struct loss_arrays {
  std::size_t rows = 0, tokens = 0;  //!< B and B * loss_row_len
  const T *log_prob = nullptr, *old_log_prob = nullptr, *ref_log_prob = nullptr, *advantages = nullptr;
  const T *weights = nullptr, *entropy = nullptr;  //!< rollout-correction weights in [0.5, 1.5], H in [0, 3]
  const std::uint8_t* mask = nullptr;
  const std::int64_t* offsets = nullptr;  //!< [B + 1], packed layout (rows of loss_row_len)
  T *grad_log_prob = nullptr, *grad_entropy = nullptr;
  double valid_tokens = 0, sequences = 0;  //!< the normaliser's N and S
};
//! The arrays of `tokens` tokens (a multiple of loss_row_len), 64-byte aligned, made on first use.
template <class T>
const loss_arrays<T>& loss_data(std::size_t tokens);

// ---- logits: N rows of V logits, N = responses x tokens per response ------------------------------
struct logits_arrays {
  std::size_t rows = 0, vocab = 0;
  std::size_t responses = 0, response_len = 0;  //!< the token layout of the fused loss (padded)
  const float* logits = nullptr;
  const std::uint16_t* logits_bf16 = nullptr;  //!< bf16 bit patterns of `logits` (round to nearest even)
  float* grad = nullptr;
  std::uint16_t* grad_bf16 = nullptr;
  const std::int64_t* labels = nullptr;
  //! Saved statistics for the backward (exact, float64, of the float logits) and its incoming
  //! per-row gradients (bench_logits.cpp's: -1/N and 0.01).
  const double *lse = nullptr, *entropy = nullptr, *grad_log_prob = nullptr, *grad_entropy = nullptr;
  double *out_log_prob = nullptr, *out_entropy = nullptr, *out_lse = nullptr;  //!< the forward's outputs
  //! Token inputs of policy_loss_from_logits (float): old / reference log-probs near the exact ones.
  const float *old_log_prob = nullptr, *ref_log_prob = nullptr, *advantages = nullptr;
  const std::uint8_t* mask = nullptr;
  float *buf_log_prob = nullptr, *buf_entropy = nullptr, *buf_grad_log_prob = nullptr, *buf_grad_entropy = nullptr,
        *buf_lse = nullptr;
};
//! The arrays of `rows` x `vocab` logits (rows a multiple of 128, the tokens per response), made on
//! first use.
const logits_arrays& logits_data(std::size_t rows, std::size_t vocab);

// ---- the cases -----------------------------------------------------------------------------------------
//! A case made ready to run on one side: `call` runs the library once (views, configuration and data
//! bound) and returns a value to compare across the sides (the loss, or a statistic).
struct prepared_case {
  std::function<double()> call;
  double items = 0;  //!< tokens or logits per call
  double bytes = 0;  //!< bytes read and written per call
};
//! One case of one side. `prepare` may throw (a configuration the side's code rejects).
struct side_case {
  std::string name;  //!< "loss/<case>", the same on both sides
  std::function<prepared_case()> prepare;
};
//! Each side's register_cases() adds its cases ("new" / "old") in a fixed order.
void add_case(const std::string& side, side_case c);
[[nodiscard]] const std::vector<side_case>& cases_of(const std::string& side);

}  // namespace ab
