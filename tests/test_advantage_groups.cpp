// Tests for ulorl/advantage/groups.hpp: partitions from ids (sorted, unsorted, sparse) and fixed sizes.
#include <ulorl/advantage/groups.hpp>

#include <map>
#include <set>
#include <vector>

#include "catch.hpp"
#include "support/random.hpp"

TEST_CASE("group_layout from ids is a partition matching a map of ids", "[groups]") {
  testing_support::rng r(3);
  for (std::size_t n : {1u, 2u, 5u, 47u, 1000u}) {
    for (bool sorted : {false, true}) {
      auto ids = testing_support::random_group_ids(r, n);
      if (sorted) std::sort(ids.begin(), ids.end());
      const auto g = ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids));
      std::map<std::int64_t, std::set<std::size_t>> expected;
      for (std::size_t i = 0; i < n; ++i) expected[ids[i]].insert(i);
      REQUIRE(g.count() == expected.size());
      REQUIRE(g.responses() == n);
      std::size_t seen = 0, last_first = 0;
      for (std::size_t k = 0; k < g.count(); ++k) {
        const auto mem = g.members(k);
        REQUIRE(!mem.empty());
        const std::set<std::size_t> got(mem.begin(), mem.end());
        REQUIRE(got == expected[ids[mem[0]]]);
        REQUIRE(std::is_sorted(mem.begin(), mem.end()));
        if (k > 0) REQUIRE(mem[0] > last_first);  // numbered by first appearance
        last_first = mem[0];
        for (auto i : mem) REQUIRE(g.group_of(i) == k);
        seen += mem.size();
      }
      REQUIRE(seen == n);
    }
  }
}

TEST_CASE("ids that repeat in separate runs are one group", "[groups]") {
  const std::vector<int> ids{4, 4, 9, 4, 9};
  const auto g = ulorl::group_layout::from_ids(std::span<const int>(ids));
  REQUIRE(g.count() == 2);
  REQUIRE(std::vector<std::uint32_t>(g.members(0).begin(), g.members(0).end()) == std::vector<std::uint32_t>{0, 1, 3});
}

TEST_CASE("fixed group size", "[groups]") {
  const auto g = ulorl::group_layout::fixed(12, 4);
  REQUIRE(g.count() == 3);
  REQUIRE(g.members(2)[0] == 8);
  REQUIRE_THROWS_WITH(ulorl::group_layout::fixed(10, 4), Catch::Contains("'group_size' = 4"));
  REQUIRE_THROWS_WITH(ulorl::group_layout::fixed(10, 0), Catch::Contains("must be >= 1"));
  REQUIRE_THROWS_WITH(ulorl::group_layout::fixed(0, 4), Catch::Contains("empty batch"));
}

TEST_CASE("fixed group size: more responses than 32-bit indices hold are refused before any allocation",
          "[groups][errors]") {
  // from_ids has the same bound; k * group_size would wrap in the uint32 group starts.
  const std::size_t n = std::size_t{UINT32_MAX} + 1;
  REQUIRE_THROWS_WITH(ulorl::group_layout::fixed(n, 1), Catch::Contains("more than 2^32-1 responses"));
  REQUIRE_THROWS_WITH(ulorl::group_layout::fixed(2 * n, n), Catch::Contains("'scores' = 8589934592"));
}

TEST_CASE("negative ids and empty batches are rejected", "[groups][errors]") {
  const std::vector<std::int64_t> bad{0, 3, -1};
  REQUIRE_THROWS_WITH(ulorl::group_layout::from_ids(std::span<const std::int64_t>(bad)),
                      Catch::Contains("'group_ids'[2] = -1"));
  REQUIRE_THROWS_AS(ulorl::group_layout::from_ids(std::span<const std::int64_t>()), ulorl::error);
}

TEST_CASE("assign_ids reuses a layout and matches from_ids", "[groups]") {
  testing_support::rng r(9);
  ulorl::group_layout reused;
  for (std::size_t n : {1000u, 3u, 47u, 1u, 1000u}) {
    const auto ids = testing_support::random_group_ids(r, n);
    reused.assign_ids(std::span<const std::int64_t>(ids));
    const auto fresh = ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids));
    REQUIRE(reused.count() == fresh.count());
    for (std::size_t g = 0; g < fresh.count(); ++g)
      REQUIRE(std::equal(reused.members(g).begin(), reused.members(g).end(), fresh.members(g).begin(), fresh.members(g).end()));
  }
  const std::vector<std::int64_t> bad{1, -2};
  const auto before = reused.count();
  REQUIRE_THROWS_AS(reused.assign_ids(std::span<const std::int64_t>(bad)), ulorl::error);
  REQUIRE(reused.count() == before);
}
