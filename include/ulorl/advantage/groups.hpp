// ulorl/advantage/groups.hpp — which responses form a prompt's group. Groups come from per-response
// ids that may be unsorted, non-contiguous, of unequal sizes or singletons (verl's `index`,
// NeMo-RL), or from a fixed group size over contiguous blocks (TRL `num_generations`, OpenRLHF
// `n_samples_per_prompt`). Building a `group_layout` from ids costs O(B) time and memory (a hash
// table of the ids and a counting sort); a fixed size costs O(B).
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
#include "ulorl/core/flat_map.hpp"

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
    group_layout g;
    g.assign_ids(ids, fn, arg);
    return g;
  }

  //! Rebuilds this layout from new ids, reusing its memory: a trainer that keeps one layout and
  //! calls this every step allocates nothing once the buffers have grown (fresh multi-megabyte
  //! buffers cost more in page faults than the grouping itself). On error the layout is unchanged.
  template <class I>
  void assign_ids(std::span<const I> ids, std::string_view fn = "group_layout", std::string_view arg = "group_ids") {
    static_assert(std::is_integral_v<I>, "group ids must be integers");
    if (ids.empty()) detail::fail(fn, arg, "empty batch: at least one response is required");
    if (ids.size() > UINT32_MAX) detail::fail(fn, arg, "more than 2^32-1 responses");
    if constexpr (std::is_signed_v<I>) {
      for (std::size_t i = 0; i < ids.size(); ++i)
        if (ids[i] < 0) detail::fail_at(fn, arg, static_cast<std::int64_t>(i), ids[i], "group ids must be >= 0");
    }
    // Dense group numbers by first appearance through a hash table of the ids (O(B)), then a
    // counting sort of the responses by group, which keeps each group's members in order.
    // The table grows with the number of distinct ids (load <= 1/2), not with B; it restarts
    // small each call (a small table stays in cache) and reuses its buffers as it grows.
    const std::size_t n = ids.size();
    index_.reset();
    group_of_.resize(n);
    std::vector<std::uint32_t>& counts = start_;  // counts live in start_[1..] until the prefix sum
    counts.assign(1, 0u);
    for (std::size_t i = 0; i < n; ++i) {
      const auto [g, inserted] =
          index_.try_emplace(static_cast<std::uint64_t>(ids[i]), static_cast<std::uint32_t>(counts.size() - 1));
      if (inserted) counts.push_back(0);
      group_of_[i] = *g;
      ++counts[*g + 1];
    }
    for (std::size_t k = 1; k < start_.size(); ++k) start_[k] += start_[k - 1];
    order_.resize(n);
    next_.assign(start_.begin(), start_.end() - 1);
    for (std::size_t i = 0; i < n; ++i) order_[next_[group_of_[i]]++] = static_cast<std::uint32_t>(i);
  }

  //! Contiguous blocks of `group_size` responses; `responses` must be a positive multiple of it.
  [[nodiscard]] static group_layout fixed(std::size_t responses, std::size_t group_size,
                                          std::string_view fn = "group_layout",
                                          std::string_view arg = "group_size") {
    if (responses == 0) detail::fail(fn, "scores", "empty batch: at least one response is required");
    // Indices and group starts (k * group_size <= responses) are stored as uint32.
    if (responses > UINT32_MAX) detail::fail_value(fn, "scores", responses, "more than 2^32-1 responses");
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
  std::vector<std::uint32_t> order_;     // response indices, grouped
  std::vector<std::uint32_t> start_;     // group g is order_[start_[g] .. start_[g+1])
  std::vector<std::uint32_t> group_of_;  // response -> group
  // scratch of assign_ids, kept for reuse
  detail::flat_int_map<std::uint64_t, std::uint32_t> index_;  // id -> group
  std::vector<std::uint32_t> next_;
};

ULORL_NAMESPACE_END
