// rlvr_demo — a real, small RLVR run with every piece of ulorl working together.
//
// A tiny autoregressive policy (two-layer MLP, Eigen) learns to sort 1-4 digits and stop, rewarded
// only by a verifier (exact answer = 1). Each training step:
//   rollout   UloRL segment scheduler, the policy itself as the inference engine: responses are
//             decoded a segment at a time, unfinished ones continue next step under the updated
//             policy, groups of G are released whole; behaviour log-probs are kept per token
//             (segment-aware importance sampling)
//   reward    verifier, truncated-is-incorrect (UloRL), DAPO dynamic-sampling statistics
//   advantage GRPO (verl preset), broadcast to tokens (packed layout)
//   logits    fused log-prob + entropy from logits (one pass), and d loss / d logits (one pass)
//   masking   dynamic MPT masking (UloRL): mastered positive tokens of low-entropy responses
//   loss      clip-higher (eps 0.2 / 0.28) + k3 KL to a reference policy, token-mean with the step's
//             global normaliser, two PPO epochs
//   control   adaptive KL coefficient, ProRL reference reset (reference <- policy, optimizer reset)
//             on a validation plateau
// It is the minimal example of ulorl in a C++ trainer without libtorch (the main example is the
// libtorch trainer, examples/rlvr_trainer). Output: one line per step and a summary; --no-mpt turns
// the masking off. Everything is seeded; the same command prints the same numbers.
#include <ulorl/ulorl.hpp>
#include <ulorl/logits.hpp>
#include <ulorl/loss.hpp>
#include <ulorl/rollout.hpp>

#include <Eigen/Core>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/args.hpp"
#include "rlvr_demo_model.hpp"

namespace {

struct options {
  int steps = 200;
  int prompts = 32;        // groups per training step
  int group = 8;           // responses per prompt (G)
  int segments = 3;        // UloRL n_seg
  int epochs = 2;          // PPO epochs over each batch
  int hidden = 64;
  int warmup = 40;         // supervised warm-up steps before RL (0: RL from scratch)
  int validate_every = 10;
  int validation_prompts = 400;
  double lr = 3e-3;
  double kl_coef = 1e-3;
  double kl_target = 0.5;  // per-token k3 KL the adaptive controller steers to (the toy moves far)
  double tau = 0.99, sigma = 0.2;
  bool mpt = true;
  std::uint64_t seed = 1;
};

struct step_row {
  int step = 0;
  double reward = 0, accuracy = 0, val_accuracy = -1, entropy = 0, masked = 0, kl = 0, kl_coef = 0;
  double clip_low = 0, clip_high = 0, tokens_per_s = 0, zero_var_groups = 0, reset = 0, staleness = 0;
  double pg_loss = 0;
};

struct summary {
  double initial_accuracy = 0, final_accuracy = 0, final_entropy = 0, min_entropy = 1e9, seconds = 0;
  int resets = 0, steps = 0;
};

// A response being decoded: its prompt, tokens so far and the behaviour log-prob of each token.
struct live_response {
  std::vector<int> tokens;
  std::vector<float> behaviour_logp;
};

class trainer {
 public:
  explicit trainer(const options& o, bool use_mpt) : o_(o), use_mpt_(use_mpt), gen_(o.seed) {
    feat_.tk = task_;
    std::mt19937_64 init(o.seed * 7919 + 1);
    policy_ = demo::policy(feat_.dim(), o.hidden, task_.vocab(), init);
    opt_.lr = o.lr;
    opt_.reset(policy_);
    std::mt19937_64 vgen(o.seed + 1000003);
    for (int i = 0; i < o.validation_prompts; ++i) validation_.push_back(task_.sample_prompt(vgen));
  }

  summary run() {
    const auto t0 = std::chrono::steady_clock::now();
    if (o_.warmup > 0) supervised_warmup();
    reference_ = policy_;
    summary s;
    s.initial_accuracy = validate();
    last_val_ = s.initial_accuracy;
    ulorl::segment_scheduler sched({.group_size = o_.group,
                                    .max_response_tokens = task_.max_response(),
                                    .num_segments = o_.segments,
                                    .max_active_responses = static_cast<std::int64_t>(o_.prompts) * o_.group * 2,
                                    .release_batch_groups = o_.prompts});
    ulorl::kl_controller klc({.type = ulorl::kl_control_type::adaptive,
                              .init_coef = o_.kl_coef,
                              .target_kl = o_.kl_target,
                              .horizon = 1000});
    // ProRL: reset the reference (and the optimizer) when validation accuracy stops improving.
    ulorl::reference_reset_policy resets({.patience = 3, .min_delta = 0.005, .cooldown_steps = 20});
    for (int step = 1; step <= o_.steps; ++step) {
      const auto ts = std::chrono::steady_clock::now();
      step_row row;
      row.step = step;
      const auto& batch = rollout(sched, row);
      row.kl_coef = klc.value();
      train(batch, row.kl_coef, row);
      klc.update(row.kl, static_cast<std::int64_t>(batch.responses.size()));  // verl: n_steps = batch size
      sched.update_policy(sched.policy_version() + 1);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
      row.tokens_per_s = static_cast<double>(trained_tokens_) / secs;
      auto act = resets.observe_step(step, row.kl * row.kl_coef, std::abs(row.pg_loss));
      if (step % o_.validate_every == 0 || step == o_.steps) {
        row.val_accuracy = validate();
        last_val_ = row.val_accuracy;
        const auto v = resets.observe_validation(step, row.val_accuracy);
        if (v.reset_reference) act = v;
      }
      if (act.reset_reference) {
        reference_ = policy_;  // ProRL: the reference becomes the current policy ...
        if (act.reset_optimizer) opt_.reset(policy_);  // ... and the optimizer state is cleared
        row.reset = 1;
        ++s.resets;
      }
      s.min_entropy = std::min(s.min_entropy, row.entropy);
      s.final_entropy = row.entropy;
      print_row(row, step == 1);
    }
    s.steps = o_.steps;
    s.final_accuracy = last_val_;
    s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return s;
  }

 private:
  // ---- rollout: the segment scheduler drives, the policy decodes ---------------------------------
  const ulorl::experience_batch& rollout(ulorl::segment_scheduler& sched, step_row& row) {
    step_tokens_ = 0;
    while (sched.ready_groups() < o_.prompts) {
      if (sched.queued_groups() < o_.prompts) sched.offer_prompts(o_.prompts);
      const auto plan = sched.plan();
      for (std::int64_t g = plan.first_new_group; g < plan.first_new_group + plan.new_groups; ++g)
        prompts_[g] = task_.sample_prompt(gen_);
      for (const auto& item : plan.items) {
        auto& r = live_[item.response_id];
        const auto& prompt = prompts_.at(item.group_id);
        std::int64_t produced = 0;
        bool eos = false;
        while (produced < item.max_new_tokens && !eos) {
          const int tok = sample_next(prompt, r);
          eos = tok == task_.eos();
          ++produced;
        }
        step_tokens_ += produced;
        sched.report(item.response_id, produced, eos ? ulorl::decode_outcome::eos : ulorl::decode_outcome::segment_end);
      }
      (void)sched.end_step();
    }
    const auto& batch = sched.take_experience();
    double stale = 0;
    for (const auto& r : batch.responses) stale += static_cast<double>(batch.staleness(r).versions_spanned);
    row.staleness = stale / static_cast<double>(batch.responses.size());
    return batch;
  }

  int sample_next(const std::vector<int>& prompt, live_response& r) {
    std::vector<float> x(static_cast<std::size_t>(feat_.dim()));
    feat_.write(prompt, r.tokens, r.tokens.size(), x.data());
    demo::mat xm = Eigen::Map<demo::mat>(x.data(), 1, feat_.dim());
    demo::policy::cache c;
    policy_.forward(xm, c);
    std::vector<double> lp(static_cast<std::size_t>(task_.vocab()));
    demo::log_softmax(c.logits.data(), task_.vocab(), lp.data());
    std::uniform_real_distribution<double> u(0.0, 1.0);
    double x01 = u(gen_), acc = 0;
    int tok = task_.vocab() - 1;
    for (int j = 0; j < task_.vocab(); ++j) {
      acc += std::exp(lp[static_cast<std::size_t>(j)]);
      if (x01 < acc) {
        tok = j;
        break;
      }
    }
    r.tokens.push_back(tok);
    r.behaviour_logp.push_back(static_cast<float>(lp[static_cast<std::size_t>(tok)]));
    return tok;
  }

  // ---- training on one released batch -------------------------------------------------------------
  void train(const ulorl::experience_batch& batch, double kl_coef, step_row& row) {
    const std::size_t B = batch.responses.size();
    std::vector<std::int64_t> offsets(B + 1, 0);
    std::vector<float> scores(B), adv(B);
    std::vector<std::int64_t> ids(B);
    std::vector<std::uint8_t> truncated(B);
    std::vector<const live_response*> resp(B);
    std::vector<const std::vector<int>*> prm(B);
    for (std::size_t i = 0; i < B; ++i) {
      const auto& r = batch.responses[i];
      resp[i] = &live_.at(r.response_id);
      prm[i] = &prompts_.at(r.group_id);
      ids[i] = r.group_id;
      offsets[i + 1] = offsets[i] + r.tokens;
      truncated[i] = r.final_state == ulorl::response_state::truncated;
      scores[i] = static_cast<float>(task_.reward(*prm[i], resp[i]->tokens));
    }
    double acc = 0;
    for (float s : scores) acc += s;
    row.accuracy = acc / static_cast<double>(B);
    ulorl::truncated_as_incorrect(std::span<float>(scores), std::span<const std::uint8_t>(truncated));
    const auto groups = ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids));
    std::vector<std::uint8_t> keep_groups(B);
    const auto ds = ulorl::dynamic_sampling_filter(std::span<const float>(scores), groups, std::span<std::uint8_t>(keep_groups));
    row.zero_var_groups = static_cast<double>(ds.zero_variance_groups) / static_cast<double>(ds.groups);
    double rsum = 0;
    for (float s : scores) rsum += s;
    row.reward = rsum / static_cast<double>(B);
    ulorl::group_advantages(std::span<const float>(scores), groups, std::span<float>(adv), ulorl::presets::verl::grpo_advantage().group);

    const std::size_t N = static_cast<std::size_t>(offsets[B]);
    trained_tokens_ = static_cast<std::int64_t>(N);
    const std::span<const std::int64_t> off(offsets);
    std::vector<float> tok_adv(N), ones(N, 1.0f), behaviour(N), ref_logp(N), logp(N), ent(N), lse(N), keep(N), glogp(N);
    std::vector<int> labels(N);
    demo::mat x(static_cast<Eigen::Index>(N), feat_.dim());
    for (std::size_t i = 0; i < B; ++i)
      for (std::size_t t = 0; t < resp[i]->tokens.size(); ++t) {
        const std::size_t k = static_cast<std::size_t>(offsets[i]) + t;
        feat_.write(*prm[i], resp[i]->tokens, t, x.row(static_cast<Eigen::Index>(k)).data());
        labels[k] = resp[i]->tokens[t];
        behaviour[k] = resp[i]->behaviour_logp[t];
      }
    const auto packed = [&](std::vector<float>& v) { return ulorl::packed(std::span<float>(v), off); };
    const auto cpacked = [&](const std::vector<float>& v) { return ulorl::packed(std::span<const float>(v), off); };
    ulorl::broadcast_to_tokens(std::span<const float>(adv), cpacked(ones), packed(tok_adv));

    // Reference log-probs (fixed for the batch).
    demo::policy::cache rc;
    reference_.forward(x, rc);
    stats(rc.logits, labels, ref_logp, ent, lse);

    ulorl::policy_loss_config cfg;
    cfg.objective = {.kind = ulorl::objective_kind::ppo_clip, .eps_low = 0.2, .eps_high = 0.28};
    cfg.kl = {.estimator = ulorl::kl_estimator::k3};
    cfg.kl_coef = kl_coef;
    // Dynamic MPT masking on the current policy's probabilities and entropies; masked MPTs still
    // count in the step's normaliser, so masking removes their gradient without re-weighting the rest.
    const ulorl::mpt_config mcfg{.mode = use_mpt_ ? ulorl::mpt_mode::dynamic_mask : ulorl::mpt_mode::off,
                                 .tau = o_.tau,
                                 .sigma = o_.sigma};
    cfg.normalizer = ulorl::global_normalizer(ulorl::agg_mode::token_mean, ulorl::count_batch(cpacked(ones)));
    const std::size_t V = static_cast<std::size_t>(task_.vocab());
    for (int epoch = 0; epoch < o_.epochs; ++epoch) {
      demo::policy::cache c;
      policy_.forward(x, c);
      // One fused call: statistics, the MPT mask (the hook, writing `keep`, the loss's mask), the
      // loss and d loss / d logits.
      ulorl::mpt_stats ms{};
      const auto mpt_hook = [&](const ulorl::token_statistics<float>& st) {
        ms = ulorl::mpt_mask(ulorl::mpt_batch<float, float, float>{.log_prob = st.log_prob,
                                                                    .old_log_prob = cpacked(behaviour),
                                                                    .entropy = st.entropy,
                                                                    .mask = cpacked(ones),
                                                                    .response_score = std::span<const float>(scores)},
                             packed(keep), mcfg);
      };
      demo::mat dlogits(static_cast<Eigen::Index>(N), task_.vocab());
      const auto res = ulorl::policy_loss_from_logits(
          ulorl::matrix_view<const float>(c.logits.data(), N, V), std::span<const int>(labels),
          ulorl::policy_loss_inputs<float, float>{.log_prob = {},
                                                  .old_log_prob = cpacked(behaviour),
                                                  .advantages = cpacked(tok_adv),
                                                  .mask = cpacked(keep),
                                                  .ref_log_prob = cpacked(ref_logp)},
          ulorl::logits_loss_buffers<float>{.log_prob = packed(logp),
                                            .entropy = packed(ent),
                                            .grad_log_prob = packed(glogp),
                                            .grad_entropy = {},
                                            .lse = ulorl::vector_view<float>(lse.data(), N)},
          ulorl::matrix_view<float>(dlogits.data(), N, V),
          cfg, ulorl::logits_config{}, ulorl::sequential_executor{}, mpt_hook);
      demo::policy grad;
      policy_.backward(c, dlogits, grad);
      opt_.step(policy_, grad);
      if (epoch == 0) {
        const double n = std::max(1.0, res.metrics.tokens);
        double hsum = 0;
        for (float h : ent) hsum += h;
        row.entropy = hsum / static_cast<double>(N);
        row.masked = ms.masked_fraction();
        row.kl = res.metrics.kl_sum / n;
        row.pg_loss = res.pg_loss;
      }
      if (epoch == o_.epochs - 1) {
        const double n = std::max(1.0, res.metrics.tokens);
        row.clip_low = res.metrics.clipped_low / n;
        row.clip_high = res.metrics.clipped_high / n;
      }
    }
    for (const auto& r : batch.responses) live_.erase(r.response_id);
  }

  void stats(const demo::mat& logits, const std::vector<int>& labels, std::vector<float>& logp, std::vector<float>& ent,
             std::vector<float>& lse) const {
    const std::size_t n = labels.size();
    ulorl::logits_forward(ulorl::matrix_view<const float>(logits.data(), n, static_cast<std::size_t>(task_.vocab())),
                          std::span<const int>(labels), ulorl::vector_view<float>(logp.data(), n),
                          ulorl::vector_view<float>(ent.data(), n), ulorl::vector_view<float>(lse.data(), n));
  }

  // ---- supervised warm-up: a few steps of cross-entropy on correct answers ------------------------
  void supervised_warmup() {
    for (int s = 0; s < o_.warmup; ++s) {
      std::vector<std::vector<int>> prompts, answers;
      std::size_t n = 0;
      for (int i = 0; i < 64; ++i) {
        prompts.push_back(task_.sample_prompt(gen_));
        answers.push_back(task_.answer(prompts.back()));
        n += answers.back().size();
      }
      demo::mat x(static_cast<Eigen::Index>(n), feat_.dim());
      std::vector<int> labels(n);
      std::size_t k = 0;
      for (std::size_t i = 0; i < prompts.size(); ++i)
        for (std::size_t t = 0; t < answers[i].size(); ++t, ++k) {
          feat_.write(prompts[i], answers[i], t, x.row(static_cast<Eigen::Index>(k)).data());
          labels[k] = answers[i][t];
        }
      demo::policy::cache c;
      policy_.forward(x, c);
      std::vector<float> logp(n), ent(n), lse(n), g(n, -1.0f / static_cast<float>(n));
      stats(c.logits, labels, logp, ent, lse);
      demo::mat dlogits(static_cast<Eigen::Index>(n), task_.vocab());
      ulorl::logits_backward(ulorl::matrix_view<const float>(c.logits.data(), n, static_cast<std::size_t>(task_.vocab())),
                             std::span<const int>(labels), ulorl::vector_view<const float>(lse.data(), n),
                             ulorl::vector_view<const float>(ent.data(), n), ulorl::vector_view<const float>(g.data(), n),
                             ulorl::vector_view<const float>(), ulorl::matrix_view<float>(dlogits.data(), n, static_cast<std::size_t>(task_.vocab())));
      demo::policy grad;
      policy_.backward(c, dlogits, grad);
      opt_.step(policy_, grad);
    }
    opt_.reset(policy_);
  }

  // ---- greedy validation accuracy on held-out prompts ---------------------------------------------
  double validate() const {
    int correct = 0;
    std::vector<float> x(static_cast<std::size_t>(feat_.dim()));
    std::vector<double> lp(static_cast<std::size_t>(task_.vocab()));
    for (const auto& p : validation_) {
      std::vector<int> out;
      while (static_cast<int>(out.size()) < task_.max_response()) {
        feat_.write(p, out, out.size(), x.data());
        demo::policy::cache c;
        policy_.forward(Eigen::Map<demo::mat>(x.data(), 1, feat_.dim()), c);
        Eigen::Index best = 0;
        c.logits.row(0).maxCoeff(&best);
        out.push_back(static_cast<int>(best));
        if (best == task_.eos()) break;
      }
      correct += task_.reward(p, out) > 0 ? 1 : 0;
    }
    return static_cast<double>(correct) / static_cast<double>(validation_.size());
  }

  void print_row(const step_row& r, bool header) const {
    if (header)
      std::printf("%5s %7s %7s %7s %8s %7s %7s %9s %8s %8s %9s %6s %6s %5s\n", "step", "reward", "acc", "val", "entropy",
                  "masked", "KL", "kl_coef", "clip_lo", "clip_hi", "tok/s", "stale", "0-var", "reset");
    char val[16] = "      -";
    if (r.val_accuracy >= 0) std::snprintf(val, sizeof val, "%7.3f", r.val_accuracy);
    std::printf("%5d %7.3f %7.3f %7s %8.4f %7.3f %7.4f %9.2e %8.4f %8.4f %9.0f %6.2f %6.2f %5s\n", r.step, r.reward,
                r.accuracy, val, r.entropy, r.masked, r.kl, r.kl_coef, r.clip_low, r.clip_high, r.tokens_per_s, r.staleness,
                r.zero_var_groups, r.reset != 0 ? "yes" : "");
  }

  options o_;
  bool use_mpt_;
  std::mt19937_64 gen_;
  demo::task task_;
  demo::featurizer feat_;
  demo::policy policy_, reference_;
  demo::adam opt_;
  std::vector<std::vector<int>> validation_;
  std::map<std::int64_t, std::vector<int>> prompts_;
  std::map<std::int64_t, live_response> live_;
  std::int64_t step_tokens_ = 0;
  std::int64_t trained_tokens_ = 0;
  double last_val_ = 0;
};

}  // namespace

namespace {

void usage() {
  std::printf("usage: rlvr_demo [--steps N] [--prompts N] [--group G] [--segments S] [--seed S] [--warmup N]\n"
              "          [--tau T] [--sigma S] [--kl-coef B] [--kl-target K] [--epochs E] [--lr LR] [--no-mpt]\n");
}

//! Every option checked (examples/common/args.hpp): whole-token numbers in the ranges below; a
//! refusal is a usage error naming the flag (exit status 2).
int run(int argc, char** argv) {
  options o;
  cli::reader args(argc, argv);
  while (args.next()) {
    const std::string_view a = args.flag();
    if (a == "--help" || a == "-h") {
      usage();
      return 0;
    }
    if (a == "--steps") o.steps = cli::integer(a, args.value(), 1, 1'000'000);
    else if (a == "--prompts") o.prompts = cli::integer(a, args.value(), 1, 4096);
    else if (a == "--group") o.group = cli::integer(a, args.value(), 2, 1024);
    else if (a == "--segments") o.segments = cli::integer(a, args.value(), 1, demo::task{}.max_response());  // at most L_max
    else if (a == "--seed") o.seed = cli::integer<std::uint64_t>(a, args.value(), 0, UINT64_MAX);
    else if (a == "--warmup") o.warmup = cli::integer(a, args.value(), 0, 1'000'000);
    else if (a == "--tau") o.tau = cli::real(a, args.value(), 0, 1, true);
    else if (a == "--kl-coef") o.kl_coef = cli::real(a, args.value(), 0, 1e6);
    else if (a == "--kl-target") o.kl_target = cli::real(a, args.value(), 0, 1e6, true);
    else if (a == "--epochs") o.epochs = cli::integer(a, args.value(), 1, 1000);
    else if (a == "--lr") o.lr = cli::real(a, args.value(), 0, 1, true);
    else if (a == "--sigma") o.sigma = cli::real(a, args.value(), 0, 100);
    else if (a == "--no-mpt") o.mpt = false;
    else args.unknown();
  }
  if (static_cast<std::int64_t>(o.prompts) * o.group > 1 << 20)
    cli::fail("--prompts", std::to_string(o.prompts) + " x --group " + std::to_string(o.group) + ": more than 2^20 responses per step");
  const auto s = trainer(o, o.mpt).run();
  std::printf("\n%s: validation accuracy %.3f -> %.3f, entropy final %.4f (min %.4f), %d reference reset(s), %d steps in %.1f s\n",
              o.mpt ? "with MPT" : "without MPT", s.initial_accuracy, s.final_accuracy, s.final_entropy, s.min_entropy,
              s.resets, s.steps, s.seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return cli::run("rlvr_demo", [&] { return run(argc, argv); });
}
