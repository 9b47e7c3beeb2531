// A downstream program: includes the umbrella header and computes GRPO advantages of one group.
#include <ulorl/ulorl.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  const std::vector<double> rewards{1.0, 0.0, 0.0, 1.0};
  std::vector<double> adv(rewards.size());
  ulorl::group_advantages(std::span<const double>(rewards), std::size_t{4}, std::span<double>(adv));
  double sum = 0;
  for (double a : adv) sum += a;
  std::printf("ulorl %d consumer: advantages %.4f %.4f %.4f %.4f (sum %.1e)\n", ULORL_VERSION, adv[0], adv[1],
              adv[2], adv[3], sum);
  return (std::fabs(sum) < 1e-12 && adv[0] > 0.8) ? 0 : 1;
}
