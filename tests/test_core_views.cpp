// Tests for ulorl/core/views.hpp: strided 1-D and 2-D views.
#include <ulorl/core/views.hpp>

#include <vector>

#include "catch.hpp"

TEST_CASE("matrix_view addresses strided memory", "[views]") {
  std::vector<int> d{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  const ulorl::matrix_view<int> m(d.data(), 3, 4);
  REQUIRE(m(2, 1) == 9);
  REQUIRE(m.row(1)[3] == 7);
  REQUIRE(m.col(2)[2] == 10);
  const ulorl::matrix_view<const int> t(d.data(), 4, 3, 1, 4);  // transpose
  REQUIRE(t(3, 2) == 11);
  REQUIRE(t(1, 0) == 1);
  const ulorl::vector_view<const int> every_other(d.data() + 1, 6, 2);
  REQUIRE(every_other[5] == 11);
  const ulorl::vector_view<const int> reversed(d.data() + 11, 12, -1);
  REQUIRE(reversed[0] == 11);
  REQUIRE(reversed[11] == 0);
}

