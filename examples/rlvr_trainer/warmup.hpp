// warmup.hpp — supervised warm-up of the policy on random correct answers before RL.
//
// Each step draws `batch` training targets, a random correct answer for each (countdown_task::
// random_answer), and minimises the cross-entropy of the response tokens given the prompt (prompt
// tokens are not predicted). An answer longer than `max_answer_tokens` is cut to its first
// `max_answer_tokens` tokens: every step of a trace applies the same local rule (and rotary
// positions make it position-independent), the large-remainder arithmetic is at the start of long
// answers and the endings are taught by the many short targets, so the window loses little and
// bounds the cost of the long tail. Examples are sorted by length and packed into micro-batches of at
// most `max_tokens_per_micro_batch` padded tokens, so the long tail of answer lengths does not pad
// every short answer to a few hundred tokens; gradients are accumulated and normalised by the
// step's response-token count. AdamW with a linear learning-rate warm-up over the first 10% of
// steps, cosine decay to 10% after, gradient-norm clipping at 1.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "batching.hpp"
#include "policy.hpp"
#include "rng.hpp"
#include "task.hpp"

namespace rlvr {

struct warmup_config {
  std::int64_t steps = 300;
  std::int64_t batch = 32;                          //!< answers per optimizer step
  double lr = 2e-3;
  double weight_decay = 0.01;
  std::int64_t max_answer_tokens = 128;             //!< longer answers are cut to their first tokens
  std::int64_t max_tokens_per_micro_batch = 4096;   //!< padded tokens per forward/backward
  std::uint64_t seed = 1;
};

struct warmup_stats {
  std::int64_t step = 0;
  double loss = 0;            //!< mean cross-entropy per response token
  double token_accuracy = 0;  //!< argmax prediction equals the answer's token
  std::int64_t tokens = 0;    //!< response tokens trained on
  double lr = 0;
  double seconds = 0;
};

class supervised_warmup {
 public:
  supervised_warmup(transformer_policy policy, const countdown_task& task, const warmup_config& config)
      : policy_(std::move(policy)),
        task_(task),
        c_(config),
        rng_(counter_hash(config.seed, 0x3A9Bu)),
        opt_(policy_->parameters(), torch::optim::AdamWOptions(config.lr).weight_decay(config.weight_decay)) {}

  //! One optimizer step on a fresh batch of random correct answers.
  warmup_stats step() {
    const auto t0 = std::chrono::steady_clock::now();
    warmup_stats st;
    st.step = ++step_;
    st.lr = learning_rate(step_);
    static_cast<torch::optim::AdamWOptions&>(opt_.param_groups().front().options()).lr(st.lr);

    // Sequences = prompt + answer; key space disjoint from the RL prompts' group ids.
    std::vector<std::vector<std::int64_t>> seqs;
    std::int64_t total = 0;
    for (std::int64_t i = 0; i < c_.batch; ++i) {
      const auto s = task_.training_target((std::uint64_t{1} << 40) + static_cast<std::uint64_t>(drawn_++));
      auto seq = task_.prompt(s);
      const auto answer = task_.random_answer(s, rng_);
      const auto kept = std::min<std::int64_t>(static_cast<std::int64_t>(answer.size()), c_.max_answer_tokens);
      seq.insert(seq.end(), answer.begin(), answer.begin() + kept);
      total += kept;
      seqs.push_back(std::move(seq));
    }
    std::sort(seqs.begin(), seqs.end(), [](const auto& a, const auto& b) { return a.size() < b.size(); });

    policy_->train();
    opt_.zero_grad();
    double loss_sum = 0, correct = 0;
    for_padded_micro_batches(
        seqs.size(), c_.max_tokens_per_micro_batch, [&](std::size_t i) { return seqs[i].size(); },
        [&](std::size_t lo, std::size_t count) {
          const auto [l, c] = micro_batch(seqs, lo, lo + count, static_cast<double>(total));
          loss_sum += l;
          correct += c;
        });
    torch::nn::utils::clip_grad_norm_(policy_->parameters(), 1.0);
    opt_.step();
    policy_->eval();
    st.loss = loss_sum;
    st.token_accuracy = correct / static_cast<double>(total);
    st.tokens = total;
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return st;
  }

 private:
  [[nodiscard]] double learning_rate(std::int64_t step) const {
    const double warm = std::max<double>(1.0, 0.1 * static_cast<double>(c_.steps));
    const auto s = static_cast<double>(step);
    if (s <= warm) return c_.lr * s / warm;
    const double progress = std::min(1.0, (s - warm) / std::max(1.0, static_cast<double>(c_.steps) - warm));
    return c_.lr * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(3.141592653589793 * progress)));
  }

  // Forward/backward of sequences [lo, hi); returns (this micro-batch's share of the step's mean
  // loss, number of correctly predicted response tokens).
  std::pair<double, double> micro_batch(const std::vector<std::vector<std::int64_t>>& seqs, std::size_t lo,
                                        std::size_t hi, double total_tokens) {
    const auto n = static_cast<std::int64_t>(hi - lo);
    const auto T = static_cast<std::int64_t>(seqs[hi - 1].size()) - 1;  // inputs drop the last token
    auto input = torch::full({n, T}, countdown_task::pad_token, torch::kInt64);
    auto labels = torch::full({n, T}, -100, torch::kInt64);  // -100: not predicted
    auto mask = torch::zeros({n, T}, torch::kBool);
    auto in = input.accessor<std::int64_t, 2>();
    auto lab = labels.accessor<std::int64_t, 2>();
    auto m = mask.accessor<bool, 2>();
    for (std::int64_t i = 0; i < n; ++i) {
      const auto& s = seqs[lo + static_cast<std::size_t>(i)];
      for (std::int64_t t = 0; t + 1 < static_cast<std::int64_t>(s.size()); ++t) {
        in[i][t] = s[static_cast<std::size_t>(t)];
        m[i][t] = true;
        if (t + 1 >= countdown_task::prompt_tokens) lab[i][t] = s[static_cast<std::size_t>(t + 1)];
      }
    }
    const auto logits = policy_->forward(input, mask);
    const auto flat = logits.reshape({n * T, -1});
    const auto target = labels.reshape({-1});
    const auto loss = torch::nn::functional::cross_entropy(
                          flat, target, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum)) /
                      total_tokens;
    loss.backward();
    const auto hits = (flat.argmax(-1) == target).logical_and(target != -100).sum().item<double>();
    return {loss.item<double>(), hits};
  }

  transformer_policy policy_;
  const countdown_task& task_;
  warmup_config c_;
  sequential_rng rng_;
  torch::optim::AdamW opt_;
  std::int64_t step_ = 0;
  std::int64_t drawn_ = 0;
};

}  // namespace rlvr
