// Tests for ulorl/core/flat_map.hpp: a randomized differential test against std::unordered_map
// (sequential, random, one-probe-chain and extreme keys), probe chains that wrap at the end of the
// table, backward-shift deletion inside wrapped chains, growth, and reuse without reallocation.
#include <ulorl/core/flat_map.hpp>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "catch.hpp"

// Catch records every assertion; the differential loop makes ~1e7 checks, so it uses this cheap form
// (the seed and mode are reported through INFO).
#define FM_CHECK(...)                                                \
  do {                                                               \
    if (!(__VA_ARGS__)) FAIL("flat_int_map property violated: " #__VA_ARGS__); \
  } while (false)

namespace {

using ulorl::detail::flat_int_map;

template <class K>
std::vector<K> extreme_keys() {
  using L = std::numeric_limits<K>;
  std::vector<K> k{K{0}, K{1}, L::max(), static_cast<K>(L::max() - 1), static_cast<K>(~std::uint64_t{0}),
                   static_cast<K>(~std::uint64_t{1})};
  if constexpr (std::is_signed_v<K>) k.push_back(L::min());
  return k;
}

// Brute force: the first `count` keys from 0, 1, 2, ... (scaled by `stride`) whose home slot is `slot`.
template <class K, class V>
std::vector<K> keys_with_home(const flat_int_map<K, V>& m, std::size_t slot, std::size_t count, std::uint64_t stride = 1) {
  std::vector<K> out;
  for (std::uint64_t c = 0; out.size() < count; ++c) {
    const auto k = static_cast<K>(c * stride);
    if (m.home(k) == slot) out.push_back(k);
  }
  return out;
}

template <class K, class V>
void check_invariants(const flat_int_map<K, V>& m) {
  if (m.capacity() == 0) {
    REQUIRE(m.size() <= 1);  // only the all-ones key can live outside a table
    return;
  }
  REQUIRE(std::has_single_bit(m.capacity()));
  REQUIRE(m.capacity() >= flat_int_map<K, V>::min_capacity);
  REQUIRE(2 * m.size() <= m.capacity());
  REQUIRE(m.load_factor() <= 0.5);
}

enum class key_mode { sequential, random, one_chain, extremes };

template <class K, class V>
void differential(std::uint64_t seed, key_mode mode, std::size_t ops) {
  std::printf("flat_int_map differential test: seed %llu, mode %d, key bytes %zu\n",
              static_cast<unsigned long long>(seed), static_cast<int>(mode), sizeof(K));
  INFO("seed " << seed << " mode " << static_cast<int>(mode));
  std::mt19937_64 gen(seed);
  const auto below = [&](std::uint64_t n) { return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(gen); };
  flat_int_map<K, V> m;
  std::unordered_map<K, V> ref;

  // Key pools; every mode also draws the extreme keys now and then.
  std::vector<K> pool;
  const auto extremes = extreme_keys<K>();
  std::size_t reserve_limit = 5000;
  if (mode == key_mode::random) {
    for (int i = 0; i < 3000; ++i) pool.push_back(static_cast<K>(gen()));
  } else if (mode == key_mode::one_chain) {
    // Long shared probe chains, two of them across the end of the table; capacity stays fixed
    // (the pool is far below the reserved size), so the chains stay shared.
    m.reserve(1024);
    const std::size_t cap = m.capacity();
    for (const std::size_t slot : {std::size_t{0}, cap - 1, cap - 2, cap / 2})
      for (const K k : keys_with_home(m, slot, 60)) pool.push_back(k);
    reserve_limit = 1024;
  } else if (mode == key_mode::extremes) {
    pool = extremes;
    for (const K e : extremes)
      for (std::uint64_t d = 1; d <= 4; ++d) pool.push_back(static_cast<K>(static_cast<std::uint64_t>(e) + d));
  }
  std::uint64_t seq_base = 1000;
  const auto draw = [&]() -> K {
    if (below(50) == 0) return extremes[below(extremes.size())];
    if (mode == key_mode::sequential) {
      // A sliding window of consecutive ids, as live prompt ids in a scheduler.
      return static_cast<K>(seq_base + below(2000));
    }
    if (mode == key_mode::random && below(8) == 0) return static_cast<K>(gen());  // mostly absent
    return pool[below(pool.size())];
  };

  std::size_t clears = 0, grows = 0, hits = 0, erased = 0;
  for (std::size_t op = 0; op < ops; ++op) {
    if (mode == key_mode::sequential && op % 16 == 0) ++seq_base;
    const auto r = below(1000);
    const K k = draw();
    const std::size_t cap_before = m.capacity();
    if (r < 420) {
      const auto v = static_cast<V>(gen());
      const auto [p, inserted] = m.try_emplace(k, v);
      const auto [it, ref_inserted] = ref.try_emplace(k, v);
      FM_CHECK(inserted == ref_inserted);
      FM_CHECK(p != nullptr);
      FM_CHECK(*p == it->second);
      if (m.capacity() != cap_before) ++grows;
      if (!inserted && below(4) == 0) {  // write through the returned pointer
        *p = static_cast<V>(gen());
        it->second = *p;
      }
    } else if (r < 700) {
      const V* p = m.find(k);
      const auto it = ref.find(k);
      FM_CHECK((p != nullptr) == (it != ref.end()));
      if (p) {
        FM_CHECK(*p == it->second);
        ++hits;
      }
      FM_CHECK(m.contains(k) == (p != nullptr));
      FM_CHECK(m.value_or(k, V{7}) == (p ? *p : V{7}));
    } else if (r < 998) {
      const bool e = m.erase(k);
      FM_CHECK(e == (ref.erase(k) == 1));
      erased += e;
    } else if (r < 999) {
      if (below(10) == 0) {
        m.clear();
        ref.clear();
        FM_CHECK(m.capacity() == cap_before);
        ++clears;
      }
    } else {
      const std::size_t n = below(reserve_limit);
      m.reserve(n);
      FM_CHECK(m.capacity() >= 2 * n);
      FM_CHECK(m.capacity() >= cap_before);
    }
    FM_CHECK(m.size() == ref.size());
    FM_CHECK(std::has_single_bit(m.capacity()) || m.capacity() == 0);
    FM_CHECK(2 * m.size() <= m.capacity() || m.capacity() == 0);
    if (op % 5000 == 0 || op + 1 == ops) {
      for (const auto& [key, val] : ref) {
        const V* p = m.find(key);
        FM_CHECK(p != nullptr);
        FM_CHECK(*p == val);
      }
    }
  }
  if (mode == key_mode::one_chain) REQUIRE(grows == 0);
  // The mix of operations must actually have exercised the map.
  REQUIRE(hits > ops / 20);
  REQUIRE(erased > ops / 50);
  REQUIRE(clears > 0);
}

}  // namespace

TEST_CASE("flat_int_map agrees with std::unordered_map under random operations", "[core][flat_map]") {
  constexpr std::size_t ops = 100'000;
  for (const std::uint64_t seed : {20261129ull, 1ull, 0xdeadbeefull}) {
    for (const auto mode : {key_mode::sequential, key_mode::random, key_mode::one_chain, key_mode::extremes}) {
      differential<std::uint64_t, std::uint32_t>(seed, mode, ops);
      differential<std::int64_t, std::int32_t>(seed + 1, mode, ops);
    }
  }
}

TEST_CASE("flat_int_map probe chains wrap at the end of the table", "[core][flat_map]") {
  flat_int_map<std::int64_t, std::int32_t> m;
  m.reserve(8);
  const std::size_t cap = m.capacity();
  REQUIRE(cap == 16);
  const auto last = keys_with_home(m, cap - 1, 3);  // A, B, C
  const auto first = keys_with_home(m, 0, 1);       // D
  const auto second = keys_with_home(m, 1, 1);      // E
  const std::int64_t A = last[0], B = last[1], C = last[2], D = first[0], E = second[0];
  for (const auto k : {A, B, C, D, E}) REQUIRE(m.try_emplace(k, static_cast<std::int32_t>(k % 1000)).second);
  // One run across the end of the table: 15, 0, 1, 2, 3.
  REQUIRE(m.slot_of(A) == cap - 1);
  REQUIRE(m.slot_of(B) == 0);
  REQUIRE(m.slot_of(C) == 1);
  REQUIRE(m.slot_of(D) == 2);
  REQUIRE(m.slot_of(E) == 3);
  // A key homed at the end whose probe crosses the whole run and lands after it.
  const auto absent = keys_with_home(m, cap - 1, 4)[3];
  REQUIRE(m.find(absent) == nullptr);

  SECTION("erasing the head of a wrapped chain shifts every later entry back across the end") {
    REQUIRE(m.erase(A));
    REQUIRE(m.slot_of(B) == cap - 1);
    REQUIRE(m.slot_of(C) == 0);
    REQUIRE(m.slot_of(D) == 1);
    REQUIRE(m.slot_of(E) == 2);
    REQUIRE(m.slot_of(A) == cap);
    REQUIRE(m.erase(B));
    REQUIRE(m.slot_of(C) == cap - 1);
    REQUIRE(m.slot_of(D) == 0);
    REQUIRE(m.slot_of(E) == 1);
    // Hole at the last slot, the next entries sit at their homes 0 and 1 beyond the end: they
    // must not move backwards past their homes (the i > j case of the shift rule).
    REQUIRE(m.erase(C));
    REQUIRE(m.slot_of(D) == 0);
    REQUIRE(m.slot_of(E) == 1);
    for (const auto k : {D, E}) REQUIRE(*m.find(k) == static_cast<std::int32_t>(k % 1000));
    REQUIRE(m.size() == 2);
  }
  SECTION("erasing inside the wrapped part keeps entries at or after their home") {
    REQUIRE(m.erase(B));  // hole at slot 0
    REQUIRE(m.slot_of(A) == cap - 1);
    REQUIRE(m.slot_of(C) == 0);
    REQUIRE(m.slot_of(D) == 1);
    REQUIRE(m.slot_of(E) == 2);
    REQUIRE(m.erase(D));  // hole at slot 1; E (home 1) moves into it, C stays
    REQUIRE(m.slot_of(C) == 0);
    REQUIRE(m.slot_of(E) == 1);
    REQUIRE(m.erase(C));  // hole at slot 0; E (home 1) must stay at 1
    REQUIRE(m.slot_of(E) == 1);
    REQUIRE(m.slot_of(A) == cap - 1);
    for (const auto k : {A, E}) REQUIRE(*m.find(k) == static_cast<std::int32_t>(k % 1000));
    for (const auto k : {B, C, D}) REQUIRE(!m.contains(k));
  }
  SECTION("growth rehashes a wrapped chain") {
    for (std::int64_t k = 100; m.capacity() == cap; ++k) m.try_emplace(k, -1);
    REQUIRE(m.capacity() == 2 * cap);
    for (const auto k : {A, B, C, D, E}) REQUIRE(*m.find(k) == static_cast<std::int32_t>(k % 1000));
  }
}

TEST_CASE("flat_int_map grows by doubling at load 1/2 and reserve() prevents growth", "[core][flat_map]") {
  for (const std::uint64_t stride : {std::uint64_t{1}, std::uint64_t{13}, std::uint64_t{1} << 20, std::uint64_t{1} << 40}) {
    INFO("stride " << stride);
    flat_int_map<std::uint64_t, std::uint32_t> m;
    REQUIRE(m.capacity() == 0);
    REQUIRE(m.find(5) == nullptr);
    REQUIRE(!m.erase(5));
    constexpr std::uint32_t n = 5000;
    for (std::uint32_t i = 0; i < n; ++i) {
      const std::size_t before = m.capacity();
      REQUIRE(m.try_emplace(i * stride, i).second);
      const std::size_t expected = before == 0 ? 16 : (2 * m.size() > before ? 2 * before : before);
      REQUIRE(m.capacity() == expected);
      check_invariants(m);
    }
    for (std::uint32_t i = 0; i < n; ++i) REQUIRE(m.value_or(i * stride, UINT32_MAX) == i);
    // Sequential and strided ids spread over the table: probes stay short (the home is the high
    // bits of a multiplicative hash, not the low bits that strides leave constant).
    double displacement = 0;
    for (std::uint32_t i = 0; i < n; ++i) {
      const std::uint64_t k = i * stride;
      displacement += static_cast<double>((m.slot_of(k) - m.home(k)) & (m.capacity() - 1));
    }
    REQUIRE(displacement / n < 4.0);

    flat_int_map<std::uint64_t, std::uint32_t> r;
    r.reserve(n);
    const std::size_t cap = r.capacity();
    REQUIRE(cap >= 2 * n);
    for (std::uint32_t i = 0; i < n; ++i) r.try_emplace(i * stride, i);
    REQUIRE(r.capacity() == cap);
    r.reserve(10);  // never shrinks
    REQUIRE(r.capacity() == cap);
  }
}

TEST_CASE("flat_int_map clear() keeps its table and refilling it does not reallocate", "[core][flat_map]") {
  flat_int_map<std::uint64_t, std::uint32_t> m;
  constexpr std::uint32_t n = 3000;
  for (std::uint32_t i = 0; i < n; ++i) m.try_emplace(std::uint64_t{i} * 7 + 3, i);
  const std::size_t cap = m.capacity();
  const std::uint32_t* first = m.find(3);
  const std::uint32_t* last = m.find(std::uint64_t{n - 1} * 7 + 3);
  for (int round = 0; round < 3; ++round) {
    m.clear();
    REQUIRE(m.size() == 0);
    REQUIRE(m.capacity() == cap);
    REQUIRE(m.find(3) == nullptr);
    for (std::uint32_t i = 0; i < n; ++i) REQUIRE(m.try_emplace(std::uint64_t{i} * 7 + 3, i + 1).second);
    REQUIRE(m.capacity() == cap);
    // Same keys in the same order land in the same slots of the same allocation.
    REQUIRE(m.find(3) == first);
    REQUIRE(m.find(std::uint64_t{n - 1} * 7 + 3) == last);
    REQUIRE(*m.find(3) == 1);
  }
}

TEST_CASE("flat_int_map stores the all-ones key beside the table", "[core][flat_map]") {
  flat_int_map<std::uint64_t, std::uint32_t> m;
  const std::uint64_t ones = UINT64_MAX;
  REQUIRE(!m.contains(ones));
  REQUIRE(m.try_emplace(ones, 9).second);
  REQUIRE(m.size() == 1);
  REQUIRE(!m.try_emplace(ones, 10).second);
  REQUIRE(*m.find(ones) == 9);
  REQUIRE(m.try_emplace(0, 1).second);
  REQUIRE(m.try_emplace(UINT64_MAX - 1, 2).second);
  REQUIRE(m.size() == 3);
  REQUIRE(m.erase(ones));
  REQUIRE(!m.erase(ones));
  REQUIRE(m.size() == 2);
  REQUIRE(*m.find(0) == 1);
  REQUIRE(*m.find(UINT64_MAX - 1) == 2);
  m.try_emplace(ones, 4);
  m.clear();
  REQUIRE(!m.contains(ones));
  REQUIRE(m.empty());

  flat_int_map<std::int64_t, std::int32_t> s;
  REQUIRE(s.try_emplace(-1, 5).second);  // -1 is the all-ones pattern
  REQUIRE(s.try_emplace(std::numeric_limits<std::int64_t>::min(), 6).second);
  REQUIRE(s.try_emplace(std::numeric_limits<std::int64_t>::max(), 7).second);
  REQUIRE(s.value_or(-1, 0) == 5);
  REQUIRE(s.value_or(std::numeric_limits<std::int64_t>::min(), 0) == 6);
  REQUIRE(s.value_or(std::numeric_limits<std::int64_t>::max(), 0) == 7);
  REQUIRE(s.slot_of(-1) == s.capacity());
}

TEST_CASE("flat_int_map reset() restarts small and regrows into the same buffers", "[core][flat_map]") {
  flat_int_map<std::uint64_t, std::uint32_t> m;
  constexpr std::uint32_t n = 3000;
  std::unordered_map<std::uint64_t, std::uint32_t> ref;
  const std::uint32_t* first[2] = {nullptr, nullptr};
  std::size_t cap = 0;
  for (int round = 0; round < 4; ++round) {
    m.reset();
    REQUIRE(m.size() == 0);
    REQUIRE(m.find(3) == nullptr);
    REQUIRE((round == 0 ? m.capacity() == 0 : m.capacity() == flat_int_map<std::uint64_t, std::uint32_t>::min_capacity));
    for (std::uint32_t i = 0; i < n; ++i) REQUIRE(m.try_emplace(std::uint64_t{i} * 7 + 3, i + static_cast<std::uint32_t>(round)).second);
    if (round == 0) cap = m.capacity();
    REQUIRE(m.capacity() == cap);
    for (std::uint32_t i = 0; i < n; ++i) REQUIRE(m.value_or(std::uint64_t{i} * 7 + 3, 0) == i + static_cast<std::uint32_t>(round));
    // From the second refill on, growth alternates between the two kept buffers: same addresses.
    if (round >= 2) REQUIRE(m.find(3) == first[round % 2]);
    first[round % 2] = m.find(3);
  }
}

TEST_CASE("flat_int_map reserve() beyond the largest table throws and changes nothing", "[core][flat_map]") {
  // The largest table is a power of two whose key array fits in PTRDIFF_MAX bytes; reserve(n) needs
  // 2n slots, so anything above half of it is refused (doubling past it would wrap to 0).
  using map64 = flat_int_map<std::int64_t, std::int32_t>;
  STATIC_REQUIRE(map64::max_capacity == std::bit_floor(static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max()) / 8));
  for (const std::size_t n : {map64::max_capacity / 2 + 1, (std::size_t{1} << 62) + 1, std::size_t{1} << 63,
                              std::numeric_limits<std::size_t>::max()}) {
    INFO("n = " << n);
    map64 m;
    m.try_emplace(5, 7);
    const auto cap = m.capacity();
    CHECK_THROWS_AS(m.reserve(n), std::length_error);
    CHECK(m.capacity() == cap);
    CHECK(m.size() == 1);
    CHECK(m.value_or(5, 0) == 7);
  }
  using map8 = flat_int_map<std::uint8_t, std::uint8_t>;
  CHECK(map8::max_capacity == std::bit_floor(static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max())));
  map8 small;
  CHECK_THROWS_AS(small.reserve(map8::max_capacity / 2 + 1), std::length_error);
  CHECK(small.capacity() == 0);
}
