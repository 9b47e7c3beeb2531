// A downstream libtorch program: GRPO advantages of one group and the gradient of a policy loss
// through ulorl::th, linked against the installed ulorl::torch component.
#include <ulorl/adapters/torch.hpp>

#include <cmath>
#include <cstdio>

int main() {
  namespace th = ulorl::th;
  const at::Tensor rewards = at::tensor({1.0, 0.0, 0.0, 1.0}, at::kDouble);
  const at::Tensor adv = th::group_advantages(rewards, std::int64_t{4});
  const at::Tensor mask = at::ones({4, 3}, at::kBool);
  const at::Tensor old = at::full({4, 3}, -1.0, at::kDouble);
  at::Tensor lp = old.clone().requires_grad_();
  ulorl::policy_loss_config cfg;
  cfg.normalizer = ulorl::global_normalizer(ulorl::agg_mode::token_mean, {.tokens = 12});
  th::policy_loss(lp, old, th::broadcast_to_tokens(adv, mask), mask, cfg).loss.backward();
  // At ratio 1 the gradient is -A / N on every token.
  const double g = lp.grad()[0][0].item<double>(), want = -adv[0].item<double>() / 12;
  std::printf("ulorl %d torch consumer: advantage %.4f, d loss / d logp %.6f\n", ULORL_VERSION, adv[0].item<double>(), g);
  return std::fabs(g - want) < 1e-12 && adv[0].item<double>() > 0.8 ? 0 : 1;
}
