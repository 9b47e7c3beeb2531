// Compiled with the project's default flags and ULORL_EXTERN_KERNELS (tests/CMakeLists.txt): the
// policy loss of portable_from_logits is ulorl_suite_kernels_opt's (-O2, default flags, uint8 masks).
#define LOGITS_ISA_NAME portable
#include "logits_isa_tu.inc"

#include <ulorl/logits/fused_loss.hpp>

namespace logits_isa {

fused_result portable_from_logits(const problem& p, const std::vector<double>& old_log_prob,
                                  const std::vector<double>& advantages) {
  const std::size_t n = p.n;
  const auto x = converted<float>(p.x);
  const auto old = converted<float>(old_log_prob), adv = converted<float>(advantages);
  const std::vector<std::uint8_t> mask(n, 1);
  const auto tokens = [&](const auto& v) {
    using E = typename std::decay_t<decltype(v)>::value_type;
    return ulorl::token_view<const E>::padded(ulorl::matrix_view<const E>(v.data(), 1, n));
  };
  const auto out = [&](std::vector<float>& v) {
    return ulorl::token_view<float>::padded(ulorl::matrix_view<float>(v.data(), 1, n));
  };
  ulorl::policy_loss_inputs<float, std::uint8_t> in{.log_prob = {}, .old_log_prob = tokens(old), .advantages = tokens(adv),
                                                    .mask = tokens(mask)};
  ulorl::policy_loss_config cfg;
  cfg.entropy_coef = 0.01;
  cfg.normalizer.denominator = static_cast<double>(n);
  std::vector<float> lp(n), ent(n), glp(n), gent(n), lse(n), g(n * p.v);
  const ulorl::logits_loss_buffers<float> buf{out(lp), out(ent), out(glp), out(gent), ulorl::vector_view<float>(lse.data(), n)};
  const ulorl::policy_loss_result res = ulorl::policy_loss_from_logits(
      ulorl::matrix_view<const float>(x.data(), n, p.v), std::span<const std::int64_t>(p.labels), in, buf,
      ulorl::matrix_view<float>(g.data(), n, p.v), cfg, ulorl::logits_config{.temperature = p.temperature});
  return {res.loss, widened(lp), widened(ent), widened(lse), widened(glp), widened(gent), widened(g)};
}

}  // namespace logits_isa
