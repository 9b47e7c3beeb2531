// Tests of ulorl/loss/metrics.hpp: accessors and exact merging of partial metrics.
#include <ulorl/loss/metrics.hpp>

#include "catch.hpp"

TEST_CASE("loss_metrics: accessors divide by the token count; merge is exact and associative") {
  ulorl::loss_metrics a;
  a.tokens = 4, a.clipped = 1, a.clipped_low = 1, a.clipped_high = 2, a.dual_clipped = 1, a.neg_log_ratio = 0.4;
  a.ratio_sum = 4.4, a.ratio_min = 0.7, a.ratio_max = 1.3, a.kl_sum = 0.2, a.entropy_sum = 8;
  ulorl::loss_metrics b;
  b.tokens = 6, b.clipped = 3, b.ratio_sum = 6, b.ratio_min = 0.9, b.ratio_max = 2.0, b.kl_sum = 0.4;
  REQUIRE(a.clip_fraction() == 0.25);
  REQUIRE(a.clip_region_fraction() == 0.75);
  REQUIRE(a.dual_clip_fraction() == 0.25);
  REQUIRE(a.approx_kl_k1() == Approx(0.1));
  REQUIRE(a.entropy_mean() == 2);
  ulorl::loss_metrics ab = a;
  ab.merge(b);
  REQUIRE(ab.tokens == 10);
  REQUIRE(ab.clip_fraction() == 0.4);
  REQUIRE(ab.ratio_min == 0.7);
  REQUIRE(ab.ratio_max == 2.0);
  REQUIRE(ab.ratio_mean() == Approx(1.04));
  REQUIRE(ab.kl_mean() == Approx(0.06));
  ulorl::loss_metrics empty;
  REQUIRE(empty.clip_fraction() == 0);
  ulorl::loss_metrics ba = b;
  ba.merge(a).merge(empty);
  REQUIRE(ba.clipped == ab.clipped);
  REQUIRE(ba.ratio_min == ab.ratio_min);
}
