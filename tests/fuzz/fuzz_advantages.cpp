// Fuzz target: group_advantages (ulorl/advantage/group_advantage.hpp) over fuzzed scores (huge
// finite values, NaN, inf, ties), group ids (any int64, negative included) or fixed group sizes,
// the framework presets and raw configurations (enum values out of range included). Each call
// either throws ulorl::error, and then `out` is untouched, or writes finite advantages; then,
// for moderate scores: a group whose scores are all equal gets 0 under the mean baselines, a
// group-mean baseline without scaling sums to ~0 over each group, and advantages never depend on
// where the group's members sit in the batch (checked by permuting the batch) beyond the rounding
// of the group statistics.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <vector>

#include "fuzz_common.hpp"
#include "ulorl/advantage.hpp"
#include "ulorl/presets.hpp"

namespace {

constexpr double sentinel = -4242.5;

ulorl::group_advantage_config config(FuzzedDataProvider& p) {
  using namespace ulorl;
  switch (p.ConsumeIntegralInRange<int>(0, 9)) {
    case 0: return presets::verl::grpo_advantage().group;
    case 1: return presets::verl::grpo_advantage({.norm_adv_by_std_in_grpo = false}).group;
    case 2: return presets::verl::rloo_advantage().group;
    case 3: return presets::trl::advantage(static_cast<presets::trl::scale_rewards>(p.ConsumeIntegralInRange<int>(0, 2))).group;
    case 4: return presets::openrlhf::advantage(static_cast<presets::openrlhf::advantage_estimator>(p.ConsumeIntegralInRange<int>(0, 2))).group;
    case 5: return presets::nemo_rl::advantage({.use_leave_one_out_baseline = p.ConsumeBool(), .normalize_rewards = p.ConsumeBool()}).group;
    case 6: return presets::open_instruct::advantage({.advantage_normalization_type = p.ConsumeBool()
                                                         ? presets::open_instruct::advantage_normalization::standard
                                                         : presets::open_instruct::advantage_normalization::centered})
                    .group;
    default: {
      group_advantage_config c;
      const int b = p.ConsumeIntegralInRange<int>(0, 3), s = p.ConsumeIntegralInRange<int>(0, 4), e = p.ConsumeIntegralInRange<int>(0, 2),
                at = p.ConsumeIntegralInRange<int>(0, 2), sg = p.ConsumeIntegralInRange<int>(0, 3), z = p.ConsumeIntegralInRange<int>(0, 2);
      c.baseline = static_cast<baseline_kind>(b);
      c.scale = static_cast<scale_kind>(s);
      c.std = static_cast<std_estimator>(e);
      c.eps_at = static_cast<eps_placement>(at);
      c.singleton = static_cast<singleton_rule>(sg);
      c.zero_std = static_cast<zero_std_rule>(z);
      c.eps = p.ConsumeBool() ? p.ConsumeFloatingPointInRange<double>(1e-9, 1e-2) : fuzz::any_double(p);
      return c;
    }
  }
}

template <class T>
void run(FuzzedDataProvider& p) {
  const std::size_t n = p.ConsumeIntegralInRange<std::size_t>(0, 40);
  const bool moderate = p.ConsumeIntegralInRange<int>(0, 2) != 0;
  std::vector<T> scores(n);
  for (auto& s : scores) {
    if (moderate) s = static_cast<T>(p.ConsumeBool() ? p.ConsumeIntegralInRange<int>(0, 3) : p.ConsumeFloatingPointInRange<double>(-100.0, 100.0));
    else s = static_cast<T>(p.ConsumeBool() ? fuzz::any_double(p) : p.ConsumeFloatingPointInRange<double>(-1e300, 1e300));
  }
  const bool by_ids = p.ConsumeBool();
  std::vector<std::int64_t> ids(n);
  std::size_t group_size = 0;
  if (by_ids) {
    for (auto& id : ids) id = p.ConsumeIntegralInRange<int>(0, 7) == 0 ? fuzz::any_int64(p) : p.ConsumeIntegralInRange<std::int64_t>(0, 5);
    if (n > 0 && p.ConsumeIntegralInRange<int>(0, 15) == 0) ids.pop_back();
  } else {
    group_size = p.ConsumeIntegralInRange<std::size_t>(0, 9);
  }
  const auto cfg = config(p);
  std::vector<T> out(n, T(sentinel));
  const auto call = [&](const std::vector<T>& sc, const std::vector<std::int64_t>& gi, std::vector<T>& o) {
    if (by_ids) ulorl::group_advantages(std::span<const T>(sc), std::span<const std::int64_t>(gi), std::span<T>(o), cfg);
    else ulorl::group_advantages(std::span<const T>(sc), group_size, std::span<T>(o), cfg);
  };
  try {
    call(scores, ids, out);
  } catch (const ulorl::error&) {
    for (const auto x : out) FUZZ_CHECK(fuzz::same_bits(x, T(sentinel)));
    return;
  }
  // A value no enum names must be rejected, never run as some default.
  FUZZ_CHECK(static_cast<int>(cfg.baseline) <= static_cast<int>(ulorl::baseline_kind::none));
  FUZZ_CHECK(static_cast<int>(cfg.scale) <= static_cast<int>(ulorl::scale_kind::batch_std));
  FUZZ_CHECK(static_cast<int>(cfg.std) <= static_cast<int>(ulorl::std_estimator::biased));
  FUZZ_CHECK(static_cast<int>(cfg.eps_at) <= static_cast<int>(ulorl::eps_placement::add_to_variance));
  FUZZ_CHECK(static_cast<int>(cfg.singleton) <= static_cast<int>(ulorl::singleton_rule::reject));
  FUZZ_CHECK(static_cast<int>(cfg.zero_std) <= static_cast<int>(ulorl::zero_std_rule::skip));
  for (const auto x : out) FUZZ_CHECK(std::isfinite(static_cast<double>(x)));
  if (!moderate) return;

  // Group membership as the caller sees it.
  std::map<std::int64_t, std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < n; ++i) groups[by_ids ? ids[i] : static_cast<std::int64_t>(i / group_size)].push_back(i);
  for (const auto& entry : groups) {
    const auto& m = entry.second;
    if (m.size() < 2) continue;
    const bool tied = std::all_of(m.begin(), m.end(), [&](std::size_t i) { return scores[i] == scores[m[0]]; });
    const bool mean_baseline = cfg.baseline != ulorl::baseline_kind::none && (cfg.scale == ulorl::scale_kind::none || cfg.eps >= 1e-9);
    if (tied && mean_baseline) for (const auto i : m) FUZZ_CHECK(std::fabs(static_cast<double>(out[i])) <= 1e-6);
    if (cfg.baseline == ulorl::baseline_kind::group_mean && cfg.scale == ulorl::scale_kind::none) {
      double sum = 0, mag = 0;
      for (const auto i : m) sum += static_cast<double>(out[i]), mag += std::fabs(static_cast<double>(scores[i]));
      FUZZ_CHECK(std::fabs(sum) <= 1e-5 * (1.0 + mag));
    }
  }
  // Permuting the batch (ids mode) permutes the advantages.
  if (by_ids && n > 1) {
    std::vector<std::size_t> perm(n);
    std::iota(perm.begin(), perm.end(), std::size_t{0});
    std::rotate(perm.begin(), perm.begin() + static_cast<std::ptrdiff_t>(p.ConsumeIntegralInRange<std::size_t>(0, n - 1)), perm.end());
    std::vector<T> s2(n), o2(n, T(sentinel));
    std::vector<std::int64_t> i2(n);
    for (std::size_t i = 0; i < n; ++i) s2[i] = scores[perm[i]], i2[i] = ids[perm[i]];
    call(s2, i2, o2);
    // Reordering changes only the rounding of the group statistics (computed in double): a
    // deviation s - b or a std moves by a few ulps of max |s| each, which the division by
    // D = sigma + eps (or sqrt(sigma^2 + eps)) >= d_min amplifies. Bound: the rounding of T plus
    // K u max|s| (1 + |a|) / d_min with K = 4 (n + 2) for the n-term sums.
    const double tol = std::is_same_v<T, float> ? 1e-4 : 1e-9;
    if (cfg.scale != ulorl::scale_kind::none && !(cfg.eps > 0)) return;  // D unbounded below: no bound
    const double d_min = cfg.scale == ulorl::scale_kind::none      ? 1.0
                         : cfg.eps_at == ulorl::eps_placement::add_to_std ? std::min(1.0, cfg.eps)
                                                                          : std::min(1.0, std::sqrt(cfg.eps));
    double biggest = 0;
    for (const auto x : scores) biggest = std::max(biggest, std::fabs(static_cast<double>(x)));
    const double cond = 4.0 * static_cast<double>(n + 2) * std::numeric_limits<double>::epsilon() * biggest / d_min;
    for (std::size_t i = 0; i < n; ++i) {
      const double a = out[perm[i]], b = o2[i];
      FUZZ_CHECK(std::fabs(a - b) <= (tol + cond) * (1.0 + std::fabs(a)));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider p(data, size);
  if (p.ConsumeBool()) run<double>(p);
  else run<float>(p);
  return 0;
}
