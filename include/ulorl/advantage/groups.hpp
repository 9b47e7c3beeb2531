// ulorl/advantage/groups.hpp — which responses form a prompt's group. Groups come from per-response
// ids that may be unsorted, non-contiguous, of unequal sizes or singletons (verl's `index`,
// NeMo-RL), or from a fixed group size over contiguous blocks (TRL `num_generations`, OpenRLHF
// `n_samples_per_prompt`). Building a `group_layout` from ids sorts once (O(B log B), O(B) memory,
// skipped when the ids are already grouped in runs); a fixed size costs O(B).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"

ULORL_NAMESPACE_BEGIN

//! Responses partitioned into groups: `members(g)` lists the response indices of group g in
//! increasing order; groups are numbered by first appearance in the batch.
class group_layout {
 public:
  group_layout() = default;

  //! Groups from per-response ids (any integer type; ids must be >= 0).
  template <class I>
  [[nodiscard]] static group_layout from_ids(std::span<const I> ids, std::string_view fn = "group_layout",
                                             std::string_view arg = "group_ids") {
    static_assert(std::is_integral_v<I>, "group ids must be integers");
    if (ids.empty()) detail::fail(fn, arg, "empty batch: at least one response is required");
    if (ids.size() > UINT32_MAX) detail::fail(fn, arg, "more than 2^32-1 responses");
    if constexpr (std::is_signed_v<I>) {
      for (std::size_t i = 0; i < ids.size(); ++i)
        if (ids[i] < 0) detail::fail_at(fn, arg, static_cast<std::int64_t>(i), ids[i], "group ids must be >= 0");
    }
    group_layout g;
    const std::size_t n = ids.size();
    g.order_.resize(n);
    std::iota(g.order_.begin(), g.order_.end(), 0u);
    // Fast path: every id forms one contiguous run and runs are distinct (checked after the sort
    // of run heads, which is cheap when groups are large).
    if (!contiguous_runs(ids)) {
      std::stable_sort(g.order_.begin(), g.order_.end(), [&](std::uint32_t a, std::uint32_t b) {
        return ids[a] < ids[b];
      });
    }
    g.group_of_.resize(n);
    std::vector<std::pair<std::uint32_t, std::uint32_t>> runs;  // (first member, run start in order_)
    for (std::size_t k = 0; k < n; ++k)
      if (k == 0 || ids[g.order_[k]] != ids[g.order_[k - 1]]) runs.emplace_back(g.order_[k], static_cast<std::uint32_t>(k));
    // Number groups by first appearance so the layout does not depend on the ids' values.
    std::vector<std::uint32_t> by_first(runs.size());
    std::iota(by_first.begin(), by_first.end(), 0u);
    std::sort(by_first.begin(), by_first.end(), [&](std::uint32_t a, std::uint32_t b) { return runs[a].first < runs[b].first; });
    std::vector<std::uint32_t> sorted_order(n);
    g.start_.assign(1, 0u);
    std::uint32_t pos = 0;
    for (std::uint32_t r : by_first) {
      const std::uint32_t begin = runs[r].second;
      const std::uint32_t end = r + 1 < runs.size() ? runs[r + 1].second : static_cast<std::uint32_t>(n);
      for (std::uint32_t k = begin; k < end; ++k) {
        sorted_order[pos] = g.order_[k];
        g.group_of_[g.order_[k]] = static_cast<std::uint32_t>(g.start_.size() - 1);
        ++pos;
      }
      g.start_.push_back(pos);
    }
    g.order_ = std::move(sorted_order);
    return g;
  }

  //! Contiguous blocks of `group_size` responses; `responses` must be a positive multiple of it.
  [[nodiscard]] static group_layout fixed(std::size_t responses, std::size_t group_size,
                                          std::string_view fn = "group_layout",
                                          std::string_view arg = "group_size") {
    if (responses == 0) detail::fail(fn, "scores", "empty batch: at least one response is required");
    if (group_size == 0) detail::fail_value(fn, arg, group_size, "must be >= 1");
    if (responses % group_size != 0)
      detail::fail_value(fn, arg, group_size,
                         "must divide the number of responses " + std::to_string(responses));
    group_layout g;
    g.order_.resize(responses);
    std::iota(g.order_.begin(), g.order_.end(), 0u);
    g.group_of_.resize(responses);
    for (std::size_t i = 0; i < responses; ++i) g.group_of_[i] = static_cast<std::uint32_t>(i / group_size);
    g.start_.resize(responses / group_size + 1);
    for (std::size_t k = 0; k < g.start_.size(); ++k) g.start_[k] = static_cast<std::uint32_t>(k * group_size);
    return g;
  }

  [[nodiscard]] std::size_t responses() const noexcept { return order_.size(); }
  [[nodiscard]] std::size_t count() const noexcept { return start_.empty() ? 0 : start_.size() - 1; }
  [[nodiscard]] std::size_t group_size(std::size_t g) const noexcept { return start_[g + 1] - start_[g]; }
  [[nodiscard]] std::span<const std::uint32_t> members(std::size_t g) const noexcept {
    return {order_.data() + start_[g], group_size(g)};
  }
  [[nodiscard]] std::uint32_t group_of(std::size_t i) const noexcept { return group_of_[i]; }

 private:
  template <class I>
  static bool contiguous_runs(std::span<const I> ids) {
    std::vector<I> heads;
    for (std::size_t i = 0; i < ids.size(); ++i)
      if (i == 0 || ids[i] != ids[i - 1]) heads.push_back(ids[i]);
    std::sort(heads.begin(), heads.end());
    return std::adjacent_find(heads.begin(), heads.end()) == heads.end();
  }

  std::vector<std::uint32_t> order_;     // response indices, grouped
  std::vector<std::uint32_t> start_;     // group g is order_[start_[g] .. start_[g+1])
  std::vector<std::uint32_t> group_of_;  // response -> group
};

ULORL_NAMESPACE_END
