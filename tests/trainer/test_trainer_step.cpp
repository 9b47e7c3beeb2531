// The libtorch trainer's GRPO update (examples/rlvr_trainer/trainer.hpp) against GRPO written out in
// plain torch here: each response forwarded alone (no padding, no micro-batches), log_softmax +
// gather, verl's group advantage (r - mean) / (std + 1e-6) with the unbiased std, the clip-higher
// surrogate, k3 to the reference, token-mean over the update's tokens. Then what the update does
// around the loss: micro-batch splits, dynamic sampling, the MPT mask, POIS, and a short end-to-end
// run with the segment scheduler and the engine (deterministic for a seed).
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <vector>

#include "catch.hpp"
#include "engine.hpp"
#include "policy.hpp"
#include "rng.hpp"
#include "rollout.hpp"
#include "task.hpp"
#include "trainer.hpp"

namespace {

using rlvr::countdown_task;

rlvr::transformer_policy small_policy(torch::Dtype dtype, std::uint64_t seed, std::int64_t max_seq = 64) {
  rlvr::transformer_policy p(rlvr::policy_config{.vocab_size = countdown_task::vocab_size, .d_model = 32, .n_heads = 2,
                                                 .n_layers = 1, .d_mlp = 64, .max_seq = max_seq, .seed = seed});
  p->to(dtype);
  torch::NoGradGuard no_grad;
  for (auto& w : p->parameters())
    if (w.dim() >= 2) w.mul_(6.0);  // logits far from uniform: ratios and clipping matter
  p->eval();
  return p;
}

//! Groups of responses with hand-set rewards, random tokens (no EOS inside) and sampling log-probs
//! near the policy's (so that ratios straddle the clip range).
rlvr::rollout_batch make_batch(const std::vector<std::vector<double>>& rewards, std::uint64_t seed) {
  rlvr::rollout_batch b;
  std::int64_t id = 0;
  for (std::size_t g = 0; g < rewards.size(); ++g) {
    b.group_ids.push_back(static_cast<std::int64_t>(100 + g));
    for (std::size_t k = 0; k < rewards[g].size(); ++k, ++id) {
      rlvr::rollout_response r;
      r.info.response_id = id;
      r.info.group_id = static_cast<std::int64_t>(100 + g);
      r.prompt = {countdown_task::bos_token, static_cast<std::int64_t>(g % 10), 3, 0};
      const auto n = static_cast<std::int64_t>(3 + rlvr::counter_hash(seed, static_cast<std::uint64_t>(id), 99) % 17);
      for (std::int64_t t = 0; t < n; ++t) {
        r.tokens.push_back(static_cast<std::int64_t>(rlvr::counter_hash(seed, static_cast<std::uint64_t>(id), static_cast<std::uint64_t>(t)) % 19));
        r.log_probs.push_back(-0.2 - 2.5 * rlvr::counter_uniform(seed, 7, static_cast<std::uint64_t>(id), static_cast<std::uint64_t>(t)));
      }
      r.tokens.back() = countdown_task::eos_token;
      r.reward = rewards[g][k];
      b.responses.push_back(std::move(r));
    }
  }
  return b;
}

std::vector<torch::Tensor> grads_of(rlvr::transformer_policy& p) {
  std::vector<torch::Tensor> g;
  for (const auto& w : p->parameters()) g.push_back(w.grad().detach().clone());
  return g;
}

double max_rel_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double scale = 0, diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, a[i].abs().max().item<double>());
    diff = std::max(diff, (a[i] - b[i]).abs().max().item<double>());
  }
  return diff / scale;
}

//! GRPO on `batch` in plain torch: returns the loss and the summed k3 KL; gradients accumulate into
//! the policy's .grad.
std::pair<double, double> reference_loss(rlvr::transformer_policy& policy, rlvr::transformer_policy& ref, const rlvr::rollout_batch& batch,
                      double beta, double temperature, bool pois) {
  std::map<std::int64_t, std::vector<double>> by_group;
  for (const auto& r : batch.responses) by_group[r.info.group_id].push_back(r.reward);
  std::vector<torch::Tensor> terms;
  double tokens = 0, kl = 0;
  for (const auto& r : batch.responses) {
    const auto& rs = by_group[r.info.group_id];
    double mean = 0, var = 0;
    for (double x : rs) mean += x;
    mean /= static_cast<double>(rs.size());
    for (double x : rs) var += (x - mean) * (x - mean);
    const double adv = (r.reward - mean) / (std::sqrt(var / static_cast<double>(rs.size() - 1)) + 1e-6);
    std::vector<std::int64_t> seq = r.prompt;
    seq.insert(seq.end(), r.tokens.begin(), r.tokens.end());
    const auto L = static_cast<std::int64_t>(r.tokens.size());
    const auto input = torch::tensor(std::vector<std::int64_t>(seq.begin(), seq.end() - 1)).unsqueeze(0);
    const auto target = torch::tensor(std::vector<std::int64_t>(seq.end() - L, seq.end()));
    const auto attn = torch::ones_like(input, torch::kBool);
    const auto lp_all = torch::log_softmax(policy->forward(input, attn)[0] / temperature, -1);
    const auto lp = lp_all.narrow(0, 3, L).gather(1, target.unsqueeze(1)).squeeze(1);
    torch::Tensor ref_lp;
    {
      torch::NoGradGuard ng;
      ref_lp = torch::log_softmax(ref->forward(input, attn)[0] / temperature, -1).narrow(0, 3, L).gather(1, target.unsqueeze(1)).squeeze(1);
    }
    const auto old = pois ? lp.detach() : torch::tensor(r.log_probs, torch::kFloat64);
    const auto ratio = torch::exp(lp - old);
    const auto pg = torch::max(-adv * ratio, -adv * torch::clamp(ratio, 0.8, 1.28));
    const auto d = ref_lp - lp;
    terms.push_back((pg + beta * (torch::exp(d) - d - 1)).sum());
    kl += (torch::exp(d) - d - 1).sum().item<double>();
    tokens += static_cast<double>(L);
  }
  const auto loss = torch::stack(terms).sum() / tokens;
  loss.backward();
  return {loss.item<double>(), kl};
}

rlvr::trainer_config exact_config(rlvr::old_policy is, std::int64_t micro_budget) {
  rlvr::trainer_config c;
  c.is = is;
  c.mpt.mode = ulorl::mpt_mode::off;
  c.kl = {.type = ulorl::kl_control_type::fixed, .init_coef = 0.3};
  c.max_tokens_per_micro_batch = micro_budget;
  c.temperature = 0.9;
  return c;
}

}  // namespace

TEST_CASE("trainer: the update's loss and gradients equal GRPO written in plain torch (float64)", "[trainer][train]") {
  torch::set_num_threads(1);
  const auto batch = make_batch({{1, 0, 0, 1}, {0, 0, 1, 0}, {1, 1, 0, 1}}, 11);
  for (const auto is : {rlvr::old_policy::sais, rlvr::old_policy::pois}) {
    for (const std::int64_t budget : {std::int64_t{40}, std::int64_t{1} << 20}) {
      INFO("IS " << (is == rlvr::old_policy::sais ? "SAIS" : "POIS") << ", micro-batch budget " << budget);
      auto policy = small_policy(torch::kFloat64, 5);
      rlvr::grpo_trainer trainer(policy, exact_config(is, budget));
      {  // a reference that differs from the policy: the KL term is not zero
        torch::NoGradGuard ng;
        for (auto& w : trainer.reference()->parameters()) w.add_(0.05 * torch::randn_like(w));
      }
      std::vector<std::size_t> all(batch.responses.size());
      std::iota(all.begin(), all.end(), std::size_t{0});
      const auto p = trainer.prepare(batch, all);
      std::vector<std::int64_t> rows(all.size());
      std::iota(rows.begin(), rows.end(), std::int64_t{0});
      for (auto& w : policy->parameters()) w.mutable_grad() = torch::Tensor();
      const auto res = trainer.loss_and_grad(p, rows);
      const auto ours = grads_of(policy);
      for (auto& w : policy->parameters()) w.mutable_grad() = torch::Tensor();
      const auto [ref_loss, ref_kl] = reference_loss(policy, trainer.reference(), batch, 0.3, 0.9, is == rlvr::old_policy::pois);
      const auto theirs = grads_of(policy);
      CHECK(res.loss == Approx(ref_loss).epsilon(1e-10));
      CHECK(res.metrics.kl_sum == Approx(ref_kl).epsilon(1e-10));
      CHECK(max_rel_diff(ours, theirs) < 1e-10);
      if (is == rlvr::old_policy::sais) CHECK(res.metrics.clipped > 0);  // the clip range is exercised
      else CHECK(res.metrics.clipped == 0);                               // POIS: every ratio is 1
      CHECK(res.metrics.tokens == p.mask.sum().item<double>());
    }
  }
}

TEST_CASE("trainer: dynamic sampling drops equal-reward groups; nothing to learn, no update", "[trainer][train]") {
  torch::set_num_threads(1);
  auto policy = small_policy(torch::kFloat32, 6);
  rlvr::grpo_trainer trainer(policy, rlvr::trainer_config{});
  const auto before = rlvr::snapshot_parameters(policy);
  const auto flat = make_batch({{1, 1, 1, 1}, {0, 0, 0, 0}}, 12);
  const auto st = trainer.train(flat, 1);
  CHECK_FALSE(st.updated);
  CHECK(st.kept_responses == 0);
  const auto after = rlvr::snapshot_parameters(policy);
  for (std::size_t i = 0; i < before.size(); ++i) CHECK(torch::equal(before[i], after[i]));

  const auto mixed = make_batch({{1, 1, 1, 1}, {0, 1, 0, 0}, {0, 0, 0, 0}}, 13);
  const auto st2 = trainer.train(mixed, 2);
  CHECK(st2.updated);
  CHECK(st2.kept_groups == 1);
  CHECK(st2.kept_responses == 4);
  CHECK(std::isfinite(st2.loss));
  CHECK(std::isfinite(st2.entropy_mean));
}

TEST_CASE("trainer: MPT removes the mastered tokens of positive responses from the loss mask", "[trainer][train][mpt]") {
  torch::set_num_threads(1);
  auto policy = small_policy(torch::kFloat64, 7);
  const auto batch = make_batch({{1, 0, 1, 0}, {0, 1, 1, 1}}, 14);
  std::vector<std::size_t> all(batch.responses.size());
  std::iota(all.begin(), all.end(), std::size_t{0});
  // Thresholds at quantiles of the positive responses' token probabilities, so both sides are populated.
  torch::Tensor probs;
  {
    rlvr::grpo_trainer probe(policy, rlvr::trainer_config{.mpt = {.mode = ulorl::mpt_mode::off}});
    const auto p = probe.prepare(batch, all);
    probs = p.log_prob.exp().masked_select(p.mask.logical_and((p.rewards >= 1.0).unsqueeze(1).expand_as(p.mask)));
  }
  for (const double q : {0.3, 0.7}) {
    const double tau = torch::quantile(probs, q).item<double>();
    INFO("tau " << tau);
    rlvr::trainer_config c;
    c.mpt = {.mode = ulorl::mpt_mode::static_mask, .tau = tau};
    rlvr::grpo_trainer trainer(policy, c);
    const auto p = trainer.prepare(batch, all);
    // Static MPT: a token of a reward-1 response whose current probability is >= tau leaves the loss.
    const auto positive = (p.rewards >= 1.0).unsqueeze(1).expand_as(p.mask);
    const auto mastered = p.mask.logical_and(positive).logical_and(p.log_prob.exp() >= tau);
    CHECK(torch::equal(p.loss_mask, p.mask.logical_and(mastered.logical_not())));
    CHECK(mastered.sum().item<std::int64_t>() > 0);
    CHECK(p.loss_mask.logical_and(positive).sum().item<std::int64_t>() > 0);
  }
}

TEST_CASE("trainer: five training steps through the scheduler and the engine (training_loop), deterministic for a seed", "[trainer][train][smoke]") {
  torch::set_num_threads(1);
  const auto run = [] {
    const countdown_task task({.max_target = 99, .max_response_tokens = 48, .seed = 3});
    auto policy = small_policy(torch::kFloat32, 9, task.max_sequence_tokens());
    rlvr::decode_engine engine(policy, {.max_batch = 16, .temperature = 1.0, .eos_token = countdown_task::eos_token, .seed = 3});
    rlvr::trainer_config c;
    c.dynamic_sampling = false;  // an untrained policy is rarely right: keep every group
    c.mini_batches = 2;
    rlvr::grpo_trainer trainer(policy, c);
    rlvr::segment_rollout rollout(task, engine,
                                  {.group_size = 4, .max_response_tokens = 48, .num_segments = 2,
                                   .max_active_responses = 16, .release_batch_groups = 2},
                                  [&](std::int64_t g) { return task.training_target(static_cast<std::uint64_t>(g)); });
    rlvr::training_loop loop(trainer, rollout, {.prompts_per_step = 2});
    std::vector<double> trace;
    for (std::int64_t version = 1; version <= 5; ++version) {
      const auto r = loop.step();
      const auto& st = r.train;
      CHECK(r.step == version);
      REQUIRE(st.updated);
      REQUIRE(std::isfinite(st.loss));
      REQUIRE(std::isfinite(st.kl_mean));
      CHECK(engine.policy_version() == version);
      CHECK(rollout.scheduler().policy_version() == version);
      trace.insert(trace.end(), {st.loss, st.kl_mean, st.entropy_mean, st.reward_mean, st.kl_coef});
    }
    trace.push_back(rlvr::sampled_accuracy(task, engine, task.validation_targets(4)));
    for (const auto& w : policy->parameters()) trace.push_back(w.sum().item<double>());
    return trace;
  };
  const auto a = run();
  const auto b = run();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == b[i]);
}
