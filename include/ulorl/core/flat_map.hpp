// ulorl/core/flat_map.hpp — an open-addressing hash map from integer keys to small trivially
// copyable values, the index behind id grouping (advantage/groups.hpp) and the segment scheduler's
// live groups (rollout/segment_scheduler.hpp).
//
// Linear probing over power-of-two key and value arrays kept at most half full (expected probes
// at load a: (1 + 1/(1-a)) / 2 for a hit, (1 + 1/(1-a)^2) / 2 for a miss; Knuth, TAOCP 6.4). The
// home slot is the low bits of splitmix64's finaliser, a full 64-bit mixer: sequential and
// strided ids (the usual prompt ids) spread like random keys. (Fibonacci hashing, the top bits of
// key * 2^64/phi, spreads sequential ids even more evenly but measured up to 35% slower on
// shuffled strided ids in bench_advantage.) Deletion shifts the rest of the probe chain back
// (Knuth's Algorithm R), so there are no tombstones and lookups do not slow down with churn.
// clear() keeps the table and reset() restarts from a small one keeping every buffer, so a map
// refilled every step stops allocating after two refills. Every key value is allowed: the
// all-ones key, which marks empty slots, lives in a slot of its own beside the table.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "ulorl/core/config.hpp"

ULORL_NAMESPACE_BEGIN

namespace detail {

//! splitmix64's finaliser (Steele, Lea & Flood 2014): every input bit flips each output bit with
//! probability ~1/2, so the low bits used as the home slot are good for sequential ids too.
[[nodiscard]] constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

//! Integer key -> value map with open addressing (linear probing, backward-shift deletion).
//! `K`: an integral type of at most 64 bits; `V`: trivially copyable. Pointers to values stay
//! valid until the next insertion that grows the table, or clear().
template <class K, class V>
class flat_int_map {
  static_assert(std::is_integral_v<K> && sizeof(K) <= 8, "flat_int_map keys are integers of at most 64 bits");
  static_assert(std::is_trivially_copyable_v<V>, "flat_int_map values are trivially copyable");

 public:
  using key_type = K;
  using mapped_type = V;

  //! Smallest table allocated; reserve() and growth keep power-of-two sizes from here.
  static constexpr std::size_t min_capacity = 16;

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  //! Slots in the table (0 before the first insertion or reserve()); a power of two.
  [[nodiscard]] std::size_t capacity() const noexcept { return keys_.size(); }
  [[nodiscard]] double load_factor() const noexcept {
    return keys_.empty() ? 0.0 : static_cast<double>(size_) / static_cast<double>(keys_.size());
  }

  //! Largest table (slots) the key and value arrays can hold: a power of two, so the doubling in
  //! reserve() and growth stops there instead of wrapping around.
  static constexpr std::size_t max_capacity =
      std::bit_floor(static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max()) /
                     std::max(sizeof(K), sizeof(V)));

  //! Makes room for `n` keys without growing (load <= 1/2). Never shrinks. Throws
  //! std::length_error when `n` exceeds max_capacity / 2 and std::bad_alloc when the memory is not
  //! there; either way the map is unchanged (the new table is built aside before the swap).
  void reserve(std::size_t n) {
    if (n > max_capacity / 2) throw std::length_error("ulorl::detail::flat_int_map::reserve: more keys than a table can hold");
    std::size_t cap = min_capacity;
    while (cap < 2 * n) cap *= 2;
    if (cap > keys_.size()) rehash(cap);
  }

  //! Removes every key and keeps the table, so refilling it up to its old size allocates nothing.
  void clear() noexcept {
    std::fill(keys_.begin(), keys_.end(), empty_key);
    size_ = 0;
    has_empty_key_ = false;
  }

  //! Removes every key and restarts from the smallest table, keeping every buffer: a map that is
  //! refilled each step grows again through the same sizes without allocating, and while it holds
  //! few keys its table stays small enough to sit in cache.
  void reset() {
    if (keys_.size() > min_capacity) {
      keys_.swap(spare_keys_);  // the larger buffers become the spares for the next growth
      vals_.swap(spare_vals_);
      keys_.resize(min_capacity);
      vals_.resize(min_capacity);
      mask_ = min_capacity - 1;
    }
    clear();
  }

  [[nodiscard]] const V* find(K key) const noexcept {
    if (key == empty_key) return has_empty_key_ ? &empty_key_value_ : nullptr;
    if (keys_.empty()) return nullptr;
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &vals_[i];
      if (keys_[i] == empty_key) return nullptr;
    }
  }
  [[nodiscard]] V* find(K key) noexcept { return const_cast<V*>(std::as_const(*this).find(key)); }
  [[nodiscard]] bool contains(K key) const noexcept { return find(key) != nullptr; }
  //! The value of `key`, or `fallback` when it is absent.
  [[nodiscard]] V value_or(K key, V fallback) const noexcept {
    const V* v = find(key);
    return v ? *v : fallback;
  }

  //! Inserts {key, value} unless `key` is present. Returns the key's value and whether it was
  //! inserted (an existing value is left unchanged). Grows (doubling) only when a new key would
  //! push the load above 1/2.
  std::pair<V*, bool> try_emplace(K key, V value) {
    if (key == empty_key) {
      if (has_empty_key_) return {&empty_key_value_, false};
      has_empty_key_ = true;
      empty_key_value_ = value;
      ++size_;
      return {&empty_key_value_, true};
    }
    if (keys_.empty()) rehash(min_capacity);
    std::size_t i = home(key);
    for (;; i = (i + 1) & mask_) {
      if (keys_[i] == key) return {&vals_[i], false};
      if (keys_[i] == empty_key) break;
    }
    if (2 * (size_ + 1) > keys_.size()) {
      if (keys_.size() >= max_capacity) throw std::length_error("ulorl::detail::flat_int_map: more keys than a table can hold");
      rehash(2 * keys_.size());
      i = free_slot(key);
    }
    keys_[i] = key;
    vals_[i] = value;
    ++size_;
    return {&vals_[i], true};
  }

  //! Removes `key`; returns whether it was present.
  bool erase(K key) noexcept {
    if (key == empty_key) {
      if (!has_empty_key_) return false;
      has_empty_key_ = false;
      --size_;
      return true;
    }
    if (keys_.empty()) return false;
    std::size_t i = home(key);
    while (keys_[i] != key) {
      if (keys_[i] == empty_key) return false;
      i = (i + 1) & mask_;
    }
    // Hole at i: an entry further along the chain moves into it unless its home lies cyclically
    // in (i, j], where a lookup starting at its home would no longer pass the hole.
    for (std::size_t j = i;;) {
      j = (j + 1) & mask_;
      if (keys_[j] == empty_key) break;
      const std::size_t h = home(keys_[j]);
      const bool movable = (i <= j) ? (h <= i || h > j) : (h <= i && h > j);
      if (movable) {
        keys_[i] = keys_[j];
        vals_[i] = vals_[j];
        i = j;
      }
    }
    keys_[i] = empty_key;
    --size_;
    return true;
  }

  //! Slot where the probe for `key` starts (requires capacity() > 0). Exposed for tests and
  //! diagnostics: keys with one home share a probe chain.
  [[nodiscard]] std::size_t home(K key) const noexcept {
    return static_cast<std::size_t>(mix64(static_cast<std::uint64_t>(key))) & mask_;
  }
  //! Slot holding `key`, or capacity() when it is absent or is the all-ones key (kept beside the
  //! table). For tests of probe-chain layout.
  [[nodiscard]] std::size_t slot_of(K key) const noexcept {
    if (key == empty_key || keys_.empty()) return keys_.size();
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return i;
      if (keys_[i] == empty_key) return keys_.size();
    }
  }

 private:
  static constexpr K empty_key = static_cast<K>(~std::uint64_t{0});

  [[nodiscard]] std::size_t free_slot(K key) const noexcept {
    std::size_t i = home(key);
    while (keys_[i] != empty_key) i = (i + 1) & mask_;
    return i;
  }
  // Allocates the new table in the spare buffers first (the only step that can throw), so a failed
  // allocation leaves the map as it was.
  void rehash(std::size_t cap) {
    ULORL_ASSERT(std::has_single_bit(cap) && cap >= 2 * size_);
    // The old table becomes the spare, so growing again after reset() reuses both buffers.
    spare_keys_.assign(cap, empty_key);
    spare_vals_.resize(cap);
    keys_.swap(spare_keys_);
    vals_.swap(spare_vals_);
    mask_ = cap - 1;
    for (std::size_t k = 0; k < spare_keys_.size(); ++k)
      if (spare_keys_[k] != empty_key) {
        const std::size_t i = free_slot(spare_keys_[k]);
        keys_[i] = spare_keys_[k];
        vals_[i] = spare_vals_[k];
      }
  }

  std::vector<K> keys_;
  std::vector<V> vals_;
  std::vector<K> spare_keys_;  // the previous table's buffers, kept for the next growth
  std::vector<V> spare_vals_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;  // includes the all-ones key when present
  bool has_empty_key_ = false;
  V empty_key_value_{};
};

}  // namespace detail

ULORL_NAMESPACE_END
