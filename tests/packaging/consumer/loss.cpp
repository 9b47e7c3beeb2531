// A downstream program that calls the policy loss compiled in its kernel library
// (ulorl_add_kernel_library): it only declares the kernels (ULORL_EXTERN_KERNELS) and links them.
#include <ulorl/loss/policy_loss.hpp>

#include <cstdio>
#include <vector>

#if !defined(ULORL_EXTERN_KERNELS)
#error "loss.cpp must be built against a kernel library (ULORL_EXTERN_KERNELS)"
#endif

int main() {
  const std::vector<float> lp{-1.0f, -2.0f, -0.5f, -1.5f}, old{-1.1f, -1.9f, -0.5f, -1.4f}, adv{1.0f, 1.0f, -1.0f, -1.0f};
  const std::vector<float> mask{1.0f, 1.0f, 1.0f, 0.0f};
  std::vector<float> grad(4);
  const auto view = [](const std::vector<float>& v) {
    return ulorl::token_view<const float>::padded(ulorl::matrix_view<const float>(v.data(), 2, 2));
  };
  const ulorl::policy_loss_inputs<float, float> in{view(lp), view(old), view(adv), view(mask)};
  ulorl::policy_loss_config cfg;
  cfg.normalizer = {ulorl::agg_mode::token_mean, 3.0, 1.0};
  const auto r = ulorl::policy_loss(in, ulorl::token_view<float>::padded(ulorl::matrix_view<float>(grad.data(), 2, 2)), cfg);
  std::printf("ulorl consumer: policy loss %.6f from the kernel library\n", r.loss);
  return (r.loss == r.loss && grad[3] == 0.0f) ? 0 : 1;
}
