// A downstream xtensor program: GRPO advantages of one group, spread over a column-major [B, T]
// token matrix through the installed ulorl::xtensor component.
#include <ulorl/adapters/xtensor.hpp>
#include <ulorl/advantage.hpp>

#include <xtensor/xtensor.hpp>

#include <cmath>
#include <cstdio>
#include <utility>

int main() {
  const xt::xtensor<double, 1> rewards = {1.0, 0.0, 0.0, 1.0};
  xt::xtensor<double, 1> adv = xt::zeros<double>({4});
  ulorl::group_advantages(ulorl::as_span(rewards), std::size_t{4}, ulorl::as_span(adv));
  xt::xtensor<double, 2, xt::layout_type::column_major> mask = xt::ones<double>({4, 3});
  mask(1, 2) = 0;
  xt::xtensor<double, 2, xt::layout_type::column_major> tok = xt::zeros<double>({4, 3});
  ulorl::broadcast_to_tokens(ulorl::as_span(std::as_const(adv)), ulorl::as_padded(std::as_const(mask)),
                             ulorl::as_padded(tok));
  std::printf("ulorl %d xtensor consumer: advantages %.4f %.4f, token (1, 2) %.1f\n", ULORL_VERSION, adv(0), adv(1),
              tok(1, 2));
  return adv(0) > 0.8 && tok(0, 2) == adv(0) && tok(1, 2) == 0.0 && tok(1, 1) == adv(1) ? 0 : 1;
}
