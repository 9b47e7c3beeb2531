// The libtorch GRPO step of docs/torch.md, compiled and run (torch_docs_snippet checks that the
// docs show exactly the lines between the [grpo-step] markers).
#include "catch.hpp"
// [grpo-step]
#include <torch/torch.h>
#include <ulorl/adapters/torch.hpp>
#include <ulorl/presets/verl.hpp>

// One GRPO step on a rollout of B responses of up to T tokens; row b * T + t of `hidden` is token t
// of response b. Returns the clip fraction (one of the metrics trainers log).
double grpo_step(torch::nn::Linear& head, torch::optim::Optimizer& opt,
                 const torch::Tensor& hidden,        // [B * T, H] final hidden states
                 const torch::Tensor& tokens,        // [B * T] sampled token ids (int64)
                 const torch::Tensor& mask,          // [B, T] response mask (bool)
                 const torch::Tensor& old_log_prob,  // [B, T] log-probs of the rollout policy
                 const torch::Tensor& rewards,       // [B] verifier rewards
                 const torch::Tensor& prompt_ids) {  // [B] prompt (group) of each response
  namespace th = ulorl::th;
  const auto preset = ulorl::presets::verl::grpo_advantage();
  const torch::Tensor adv = th::broadcast_to_tokens(th::group_advantages(rewards, prompt_ids, preset), mask, preset);
  ulorl::policy_loss_config cfg{.objective = {.eps_low = 0.2, .eps_high = 0.28}};
  // The step's global normaliser: with micro-batches, count the whole batch's tokens once.
  cfg.normalizer = ulorl::global_normalizer(ulorl::agg_mode::token_mean, {.tokens = mask.sum().item<double>()});
  // Fused head + loss: never materialises the [B * T, V] logits; GEMMs run in libtorch's BLAS.
  auto out = th::linear_head_policy_loss(hidden, head->weight, head->bias, tokens, old_log_prob, adv, mask, cfg);
  opt.zero_grad();
  out.loss.backward();
  opt.step();
  return out.result.metrics.clip_fraction();
}
// [grpo-step]

TEST_CASE("docs/torch.md GRPO step: one optimizer step raises the log-probs of positive-advantage tokens",
          "[torch][example]") {
  torch::manual_seed(3001);
  const int64_t b = 8, t = 6, h = 32, v = 50;
  torch::nn::Linear head(torch::nn::LinearOptions(h, v));
  torch::optim::SGD opt(head->parameters(), torch::optim::SGDOptions(0.5));
  const torch::Tensor hidden = torch::randn({b * t, h});
  const torch::Tensor tokens = torch::randint(0, v, {b * t}, torch::kLong);
  const torch::Tensor mask = torch::arange(t).unsqueeze(0).lt(torch::randint(2, t + 1, {b, 1}));
  const torch::Tensor rewards = torch::randint(0, 2, {b}, torch::kFloat);
  const torch::Tensor prompt_ids = torch::arange(b, torch::kLong).floor_divide(4);
  const auto log_probs = [&] {
    torch::NoGradGuard ng;
    return ulorl::th::logits_statistics(head(hidden), tokens).first.view({b, t});
  };
  const torch::Tensor before = log_probs();  // on-policy: the rollout policy is the current one
  const double clip = grpo_step(head, opt, hidden, tokens, mask, before, rewards, prompt_ids);
  CHECK(clip == 0.0);  // ratio 1 everywhere
  const auto preset = ulorl::presets::verl::grpo_advantage();
  const torch::Tensor adv =
      ulorl::th::broadcast_to_tokens(ulorl::th::group_advantages(rewards, prompt_ids, preset), mask, preset);
  CHECK((adv * (log_probs() - before)).sum().item<double>() > 0);
}
