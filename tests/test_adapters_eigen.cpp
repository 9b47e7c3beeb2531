// Tests for ulorl/adapters/eigen.hpp: storage orders, blocks and maps become correct views, and a
// GRPO computation through the adapter matches the plain one.
#include <ulorl/adapters/eigen.hpp>
#include <ulorl/advantage.hpp>

#include <Eigen/Core>

#include "catch.hpp"

TEST_CASE("Eigen matrices of both storage orders map to matrix_view", "[adapters]") {
  Eigen::Matrix<double, 3, 4, Eigen::ColMajor> cm;
  Eigen::Matrix<double, 3, 4, Eigen::RowMajor> rm;
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) cm(r, c) = rm(r, c) = 10 * r + c;
  const auto a = ulorl::as_matrix_view(cm);
  const auto b = ulorl::as_matrix_view(rm);
  for (std::size_t r = 0; r < 3; ++r)
    for (std::size_t c = 0; c < 4; ++c) {
      REQUIRE(a(r, c) == cm(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(c)));
      REQUIRE(b(r, c) == a(r, c));
    }
  // a block keeps the parent's strides
  auto blk = cm.block(1, 1, 2, 2);
  const auto v = ulorl::as_matrix_view(blk);
  REQUIRE(v.rows() == 2);
  REQUIRE(v(1, 0) == 21);
  v(0, 1) = -1;  // writes through
  REQUIRE(cm(1, 2) == -1);
  const Eigen::VectorXf col = Eigen::VectorXf::LinSpaced(5, 0, 4);
  REQUIRE(ulorl::as_vector_view(col)[3] == 3.0f);
  const auto row = rm.row(2);
  REQUIRE(ulorl::as_vector_view(row)[1] == 21);
  const auto colv = rm.col(1);
  REQUIRE(ulorl::as_vector_view(colv)[2] == 21);
}

TEST_CASE("advantages through the adapter", "[adapters]") {
  Eigen::VectorXd rewards(4);
  rewards << 1, 0, 0, 1;
  Eigen::VectorXd adv(4);
  ulorl::group_advantages(std::span<const double>(rewards.data(), 4), std::size_t{4}, std::span<double>(adv.data(), 4));
  Eigen::MatrixXd mask = Eigen::MatrixXd::Ones(4, 3);  // column-major [B, T]
  mask(1, 2) = 0;
  Eigen::MatrixXd tok(4, 3);
  ulorl::broadcast_to_tokens(std::span<const double>(adv.data(), 4), ulorl::as_padded(std::as_const(mask)), ulorl::as_padded(tok));
  REQUIRE(tok(0, 2) == Approx(adv(0)));
  REQUIRE(tok(1, 2) == 0.0);
  REQUIRE(tok(3, 0) == Approx(adv(3)));
}
