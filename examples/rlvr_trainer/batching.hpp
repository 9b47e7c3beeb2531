// batching.hpp — micro-batches of a length-sorted batch, shared by the warm-up and the GRPO update.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rlvr {

//! Rows [0, n) sorted by ascending length(i): calls f(first, count) for consecutive ranges whose
//! padded size (count x the range's longest, i.e. last, length) stays within `budget` tokens. A row
//! longer than the budget gets a range of its own.
template <class Length, class F>
void for_padded_micro_batches(std::size_t n, std::int64_t budget, Length&& length, F&& f) {
  for (std::size_t lo = 0; lo < n;) {
    std::size_t hi = lo + 1;
    while (hi < n && static_cast<std::int64_t>(length(hi)) * static_cast<std::int64_t>(hi - lo + 1) <= budget) ++hi;
    f(lo, hi - lo);
    lo = hi;
  }
}

}  // namespace rlvr
