// The libtorch trainer's policy and decoding engine (examples/rlvr_trainer): the KV-cache path
// against a full-sequence recompute, pause + resume against one uninterrupted decode, continuous
// batching against decoding alone, and the engine driven by the segment scheduler with 2 segments
// (tokens, log-probs and per-token versions against the scheduler's provenance spans).
//
// The reference everywhere is the policy's full-sequence forward (no cache, one padded batch, the
// whole causal score matrix), recomputed from the tokens alone; the weights are scaled up from the
// training initialisation so that logits are far from uniform and a cache error would show.
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <span>
#include <vector>

#include <ulorl/rollout/provenance.hpp>

#include "catch.hpp"
#include "engine.hpp"
#include "policy.hpp"
#include "rng.hpp"
#include "rollout.hpp"
#include "task.hpp"

namespace {

using seq = std::vector<std::int64_t>;
constexpr std::int64_t vocab = 22;
constexpr std::int64_t eos = 19;

rlvr::transformer_policy make_policy(torch::Dtype dtype, std::uint64_t seed, std::int64_t max_seq = 96) {
  rlvr::transformer_policy p(rlvr::policy_config{
      .vocab_size = vocab, .d_model = 64, .n_heads = 4, .n_layers = 2, .d_mlp = 128, .max_seq = max_seq, .seed = seed});
  p->to(dtype);
  torch::NoGradGuard no_grad;
  for (auto& w : p->parameters())
    if (w.dim() >= 2) w.mul_(8.0);
  p->eval();
  return p;
}

seq random_tokens(std::uint64_t seed, std::uint64_t id, std::int64_t n) {
  seq s;
  for (std::int64_t t = 0; t < n; ++t)
    s.push_back(static_cast<std::int64_t>(rlvr::counter_hash(seed, id, static_cast<std::uint64_t>(t)) % 19));  // no EOS
  return s;
}

// log softmax(z_t / T)[x_t] for t in [from_i, |x_i|) of every sequence x_i, from one right-padded
// full-sequence forward (logits at t - 1 predict token t).
std::vector<std::vector<double>> recompute(rlvr::transformer_policy& policy, const std::vector<seq>& seqs,
                                           const std::vector<std::int64_t>& from, double temperature) {
  torch::NoGradGuard no_grad;
  const auto n = static_cast<std::int64_t>(seqs.size());
  std::int64_t T = 0;
  for (const auto& s : seqs) T = std::max<std::int64_t>(T, static_cast<std::int64_t>(s.size()));
  auto tokens = torch::full({n, T}, 21, torch::kInt64);
  auto mask = torch::zeros({n, T}, torch::kBool);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::size_t t = 0; t < seqs[static_cast<std::size_t>(i)].size(); ++t) {
      tokens[i][static_cast<std::int64_t>(t)] = seqs[static_cast<std::size_t>(i)][t];
      mask[i][static_cast<std::int64_t>(t)] = true;
    }
  const auto logp = torch::log_softmax(policy->forward(tokens, mask).to(torch::kFloat64) / temperature, -1);
  const auto lp = logp.accessor<double, 3>();
  std::vector<std::vector<double>> out(seqs.size());
  for (std::size_t i = 0; i < seqs.size(); ++i)
    for (std::size_t t = static_cast<std::size_t>(from[i]); t < seqs[i].size(); ++t)
      out[i].push_back(lp[static_cast<std::int64_t>(i)][static_cast<std::int64_t>(t) - 1][seqs[i][t]]);
  return out;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

struct precision {
  torch::Dtype dtype;
  double tol;
  const char* name;
};
const precision precisions[] = {{torch::kFloat32, 1e-5, "float32"}, {torch::kFloat64, 1e-10, "float64"}};

}  // namespace

TEST_CASE("policy: same seed, same weights; full forward is causal and padding-independent", "[trainer][policy]") {
  torch::set_num_threads(1);
  auto a = make_policy(torch::kFloat64, 7), b = make_policy(torch::kFloat64, 7), c = make_policy(torch::kFloat64, 8);
  const auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
  bool all_equal = true, any_differs = false;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    all_equal = all_equal && torch::equal(pa[i], pb[i]);
    any_differs = any_differs || !torch::equal(pa[i], pc[i]);
  }
  CHECK(all_equal);
  CHECK(any_differs);

  torch::NoGradGuard no_grad;
  // Right padding, left padding and the sequence alone give the same logits on real tokens.
  const seq s = random_tokens(1, 0, 11);
  auto alone = torch::tensor(s).unsqueeze(0);
  const auto ref = a->forward(alone, torch::ones_like(alone, torch::kBool))[0];
  auto right = torch::full({1, 16}, 21, torch::kInt64), left = torch::full({1, 16}, 21, torch::kInt64);
  right.narrow(1, 0, 11).copy_(alone);
  left.narrow(1, 5, 11).copy_(alone);
  const auto mask_r = torch::arange(16).unsqueeze(0) < 11, mask_l = torch::arange(16).unsqueeze(0) >= 5;
  CHECK(torch::allclose(a->forward(right, mask_r)[0].narrow(0, 0, 11), ref, 0, 1e-12));
  CHECK(torch::allclose(a->forward(left, mask_l)[0].narrow(0, 5, 11), ref, 0, 1e-12));
  // Changing token 7 leaves the logits of positions 0..6 unchanged and changes position 7's.
  auto changed = alone.clone();
  changed[0][7] = (s[7] + 1) % 19;
  const auto out = a->forward(changed, torch::ones_like(changed, torch::kBool))[0];
  CHECK(torch::allclose(out.narrow(0, 0, 7), ref.narrow(0, 0, 7), 0, 0));
  CHECK_FALSE(torch::allclose(out[7], ref[7], 0, 1e-6));
}

TEST_CASE("engine: KV-cache log-probs equal a full-sequence recompute", "[trainer][engine]") {
  torch::set_num_threads(1);
  for (const auto& prec : precisions) {
    SECTION(prec.name) {
      auto policy = make_policy(prec.dtype, 3);
      // 9 contexts of 1..25 tokens, quotas 1..40, EOS active; 3 cache rows, so sequences join and
      // leave between iterations and rows are compacted.
      std::vector<seq> ctx;
      std::vector<rlvr::decode_request> reqs;
      for (std::int64_t i = 0; i < 9; ++i) ctx.push_back(random_tokens(2, static_cast<std::uint64_t>(i), 1 + (i * 7) % 25));
      for (std::int64_t i = 0; i < 9; ++i)
        reqs.push_back({.sequence_id = 100 + i, .context = ctx[static_cast<std::size_t>(i)], .max_new_tokens = 1 + (i * 13) % 40});
      rlvr::decode_engine engine(policy, {.max_batch = 3, .temperature = 0.7, .eos_token = eos, .seed = 5});
      std::vector<rlvr::decode_result> out;
      engine.generate(reqs, out);

      std::vector<seq> full;
      std::vector<std::int64_t> from;
      std::int64_t produced = 0, with_eos = 0;
      for (std::size_t i = 0; i < reqs.size(); ++i) {
        REQUIRE(out[i].sequence_id == reqs[i].sequence_id);
        REQUIRE(out[i].tokens.size() == out[i].log_probs.size());
        REQUIRE(static_cast<std::int64_t>(out[i].tokens.size()) <= reqs[i].max_new_tokens);
        // A result ends at EOS or at its quota, never otherwise.
        const bool ended_eos = !out[i].tokens.empty() && out[i].tokens.back() == eos;
        CHECK(out[i].eos == ended_eos);
        if (!ended_eos) CHECK(static_cast<std::int64_t>(out[i].tokens.size()) == reqs[i].max_new_tokens);
        for (std::size_t t = 0; t + 1 < out[i].tokens.size(); ++t) CHECK(out[i].tokens[t] != eos);
        with_eos += ended_eos ? 1 : 0;
        produced += static_cast<std::int64_t>(out[i].tokens.size());
        full.push_back(ctx[i]);
        full.back().insert(full.back().end(), out[i].tokens.begin(), out[i].tokens.end());
        from.push_back(static_cast<std::int64_t>(ctx[i].size()));
      }
      const auto ref = recompute(policy, full, from, 0.7);
      double worst = 0;
      for (std::size_t i = 0; i < reqs.size(); ++i) worst = std::max(worst, max_abs_diff(out[i].log_probs, ref[i]));
      std::printf("%s: %lld tokens, %lld sequences stopped at EOS, max |logp - recompute| = %.3g\n", prec.name,
                  static_cast<long long>(produced), static_cast<long long>(with_eos), worst);
      CHECK(worst <= prec.tol);
      CHECK(with_eos > 0);

      // Cost bookkeeping: every token is sampled by a prefill or a decode iteration.
      const auto& c = engine.costs();
      CHECK(c.prefill_sampled + c.decoded_tokens == produced);
      CHECK(c.prefill_sampled == 9);
      std::int64_t ctx_tokens = 0;
      for (const auto& x : ctx) ctx_tokens += static_cast<std::int64_t>(x.size());
      CHECK(c.prefill_tokens == ctx_tokens);
      const auto m = rlvr::fit_engine_model(c);
      CHECK(m.iteration_s >= 0);
      CHECK(m.per_sequence_s >= 0);
      CHECK(m.per_context_token_s >= 0);
      CHECK(m.prefill_token_s > 0);
    }
  }
}

TEST_CASE("cost fits: exact on noiseless data, one term when the data cannot separate two", "[trainer][engine]") {
  // The decode model from synthetic iterations whose batch size and context vary independently.
  rlvr::engine_costs c;
  for (std::int64_t b = 1; b <= 64; b *= 2)
    for (const std::int64_t ctx : {10, 300, 5000}) c.add_iteration(b, ctx, 2e-3 + 5e-5 * static_cast<double>(b) + 3e-8 * static_cast<double>(ctx));
  c.prefill_tokens = 1000;
  c.prefill_s = 0.25;
  auto m = rlvr::fit_engine_model(c);
  CHECK(m.iteration_s == Approx(2e-3).epsilon(1e-9));
  CHECK(m.per_sequence_s == Approx(5e-5).epsilon(1e-9));
  CHECK(m.per_context_token_s == Approx(3e-8).epsilon(1e-7));
  CHECK(m.prefill_token_s == Approx(2.5e-4));
  // Every iteration at one batch size and context: only the fixed cost is identifiable.
  rlvr::engine_costs flat;
  for (int i = 0; i < 5; ++i) flat.add_iteration(8, 100, 1e-3);
  m = rlvr::fit_engine_model(flat);
  CHECK(m.iteration_s == Approx(1e-3));
  CHECK(m.per_sequence_s == 0);
  CHECK(m.per_context_token_s == 0);

  // The update model: seconds = t_step + t_token * tokens.
  rlvr::trainer_costs t;
  for (const double tokens : {100.0, 900.0, 2500.0, 4000.0}) t.add_step(tokens, 0.3 + 2e-4 * tokens);
  auto u = rlvr::fit_trainer_model(t);
  CHECK(u.per_step_s == Approx(0.3).epsilon(1e-9));
  CHECK(u.per_token_s == Approx(2e-4).epsilon(1e-9));
  // A negative intercept would predict negative time for small batches: all of it per token instead.
  rlvr::trainer_costs neg;
  for (const double tokens : {1000.0, 2000.0, 3000.0}) neg.add_step(tokens, -0.5 + 1e-3 * tokens);
  u = rlvr::fit_trainer_model(neg);
  CHECK(u.per_step_s == 0);
  CHECK(u.per_token_s == Approx((0.5 * 1000 + 1.5 * 2000 + 2.5 * 3000) / (1e6 + 4e6 + 9e6)));
  // The same token count every step: no slope to fit, all of it per token through the origin.
  rlvr::trainer_costs same;
  for (int i = 0; i < 3; ++i) same.add_step(500.0, 1.0);
  u = rlvr::fit_trainer_model(same);
  CHECK(u.per_step_s == 0);
  CHECK(u.per_token_s == Approx(1.0 / 500.0));
  // Nothing measured: a zero model.
  u = rlvr::fit_trainer_model(rlvr::trainer_costs{});
  CHECK(u.per_step_s == 0);
  CHECK(u.per_token_s == 0);
}

TEST_CASE("engine: greedy decoding takes each position's most likely token under a full recompute", "[trainer][engine]") {
  torch::set_num_threads(1);
  auto policy = make_policy(torch::kFloat64, 4);
  std::vector<seq> ctx;
  std::vector<rlvr::decode_request> reqs;
  for (std::int64_t i = 0; i < 6; ++i) ctx.push_back(random_tokens(9, static_cast<std::uint64_t>(i), 2 + (i * 5) % 13));
  for (std::int64_t i = 0; i < 6; ++i)
    reqs.push_back({.sequence_id = 50 + i, .context = ctx[static_cast<std::size_t>(i)], .max_new_tokens = 30});
  rlvr::decode_engine engine(policy, {.max_batch = 4, .temperature = 0.8, .eos_token = eos, .seed = 5});
  CHECK_FALSE(engine.greedy());
  engine.set_greedy(true);
  std::vector<rlvr::decode_result> out;
  engine.generate(reqs, out);
  // Greedy output does not depend on the sampling seed: a second engine with another seed agrees.
  rlvr::decode_engine other(policy, {.max_batch = 2, .temperature = 0.8, .eos_token = eos, .seed = 77});
  other.set_greedy(true);
  std::vector<rlvr::decode_result> out2;
  other.generate(reqs, out2);
  torch::NoGradGuard no_grad;
  std::int64_t checked = 0;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    CHECK(out[i].tokens == out2[i].tokens);
    seq full = ctx[i];
    full.insert(full.end(), out[i].tokens.begin(), out[i].tokens.end());
    auto tokens = torch::tensor(full).unsqueeze(0);
    const auto logp = torch::log_softmax(policy->forward(tokens, torch::ones_like(tokens, torch::kBool))[0] / 0.8, -1);
    for (std::size_t t = 0; t < out[i].tokens.size(); ++t) {
      const auto row = logp[static_cast<std::int64_t>(ctx[i].size() + t) - 1];
      CHECK(out[i].tokens[t] == row.argmax().item<std::int64_t>());
      CHECK(std::abs(out[i].log_probs[t] - row[out[i].tokens[t]].item<double>()) <= 1e-10);
      ++checked;
    }
  }
  CHECK(checked > 30);
  // Back to sampling: the same engine samples (and differs from greedy somewhere).
  engine.set_greedy(false);
  std::vector<rlvr::decode_result> sampled;
  engine.generate(reqs, sampled);
  bool differs = false;
  for (std::size_t i = 0; i < reqs.size(); ++i) differs = differs || sampled[i].tokens != out[i].tokens;
  CHECK(differs);
}

TEST_CASE("engine: a paused and resumed response equals one decoded without a pause", "[trainer][engine]") {
  torch::set_num_threads(1);
  for (const auto& prec : precisions) {
    SECTION(prec.name) {
      auto policy = make_policy(prec.dtype, 4);
      // EOS disabled so that every response runs its full 48 tokens and the pause point matters.
      rlvr::decode_engine engine(policy, {.max_batch = 4, .temperature = 1.0, .eos_token = -1, .seed = 9});
      const std::int64_t N = 48;
      std::vector<seq> ctx;
      std::vector<rlvr::decode_request> whole;
      for (std::int64_t i = 0; i < 5; ++i) ctx.push_back(random_tokens(6, static_cast<std::uint64_t>(i), 3 + 4 * i));
      for (std::int64_t i = 0; i < 5; ++i) whole.push_back({.sequence_id = i, .context = ctx[static_cast<std::size_t>(i)], .max_new_tokens = N});
      std::vector<rlvr::decode_result> ref;
      engine.generate(whole, ref);

      for (const std::int64_t k : {1, 17, 47}) {
        // First segment: k tokens each.
        std::vector<rlvr::decode_request> first = whole;
        for (auto& r : first) r.max_new_tokens = k;
        std::vector<rlvr::decode_result> a, b;
        engine.generate(first, a);
        // Resume: context = prompt + the k committed tokens (re-prefilled), first_index = k.
        std::vector<seq> resumed_ctx(5);
        std::vector<rlvr::decode_request> second;
        for (std::size_t i = 0; i < 5; ++i) {
          resumed_ctx[i] = ctx[i];
          resumed_ctx[i].insert(resumed_ctx[i].end(), a[i].tokens.begin(), a[i].tokens.end());
        }
        for (std::size_t i = 0; i < 5; ++i)
          second.push_back({.sequence_id = static_cast<std::int64_t>(i), .context = resumed_ctx[i], .first_index = k, .max_new_tokens = N - k});
        engine.generate(second, b);
        for (std::size_t i = 0; i < 5; ++i) {
          seq tokens = a[i].tokens;
          tokens.insert(tokens.end(), b[i].tokens.begin(), b[i].tokens.end());
          std::vector<double> lp = a[i].log_probs;
          lp.insert(lp.end(), b[i].log_probs.begin(), b[i].log_probs.end());
          INFO(prec.name << " pause after " << k << " tokens, sequence " << i);
          CHECK(tokens == ref[i].tokens);
          CHECK(max_abs_diff(lp, ref[i].log_probs) <= prec.tol);
        }
      }
    }
  }
}

TEST_CASE("engine: continuous batching gives each sequence its result decoded alone", "[trainer][engine]") {
  torch::set_num_threads(1);
  for (const auto& prec : precisions) {
    SECTION(prec.name) {
      auto policy = make_policy(prec.dtype, 5);
      std::vector<seq> ctx;
      std::vector<rlvr::decode_request> reqs;
      for (std::int64_t i = 0; i < 12; ++i) ctx.push_back(random_tokens(8, static_cast<std::uint64_t>(i), 1 + (i * 5) % 17));
      for (std::int64_t i = 0; i < 12; ++i)
        reqs.push_back({.sequence_id = 40 + i, .context = ctx[static_cast<std::size_t>(i)], .first_index = i % 3,
                        .max_new_tokens = 5 + (i * 11) % 50, .stream = 2});
      rlvr::decode_engine batched(policy, {.max_batch = 4, .temperature = 0.9, .eos_token = eos, .seed = 13});
      rlvr::decode_engine single(policy, {.max_batch = 1, .temperature = 0.9, .eos_token = eos, .seed = 13});
      std::vector<rlvr::decode_result> together;
      batched.generate(reqs, together);
      std::int64_t eos_count = 0;
      for (std::size_t i = 0; i < reqs.size(); ++i) {
        std::vector<rlvr::decode_result> alone;
        single.generate(std::span(reqs).subspan(i, 1), alone);
        INFO(prec.name << " sequence " << i);
        CHECK(together[i].tokens == alone[0].tokens);
        CHECK(together[i].eos == alone[0].eos);
        CHECK(max_abs_diff(together[i].log_probs, alone[0].log_probs) <= prec.tol);
        eos_count += together[i].eos ? 1 : 0;
      }
      CHECK(eos_count > 0);  // some leave early, so the batch really changes between iterations
      CHECK(batched.costs().decode_iterations < single.costs().decode_iterations);
    }
  }
}

TEST_CASE("rollout: the engine driven by the segment scheduler with 2 segments", "[trainer][rollout]") {
  torch::set_num_threads(1);
  // L_max 40 (segments of 20 tokens), targets up to 60; groups of 4, batches of 2 groups.
  const rlvr::countdown_task task({.max_target = 60, .max_response_tokens = 40, .seed = 2});
  auto policy = make_policy(torch::kFloat32, 6, task.max_sequence_tokens());
  rlvr::decode_engine engine(policy, {.max_batch = 8, .temperature = 1.0, .eos_token = rlvr::countdown_task::eos_token, .seed = 3});
  rlvr::segment_rollout rollout(task, engine,
                                {.group_size = 4,
                                 .max_response_tokens = 40,
                                 .num_segments = 2,
                                 .max_active_responses = 16,
                                 .release_batch_groups = 2},
                                [&](std::int64_t g) { return task.training_target(static_cast<std::uint64_t>(g)); });
  // Weight versions: a snapshot per version; each step perturbs the weights and moves the version.
  std::map<std::int64_t, std::vector<torch::Tensor>> weights{{0, rlvr::snapshot_parameters(policy)}};
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  std::int64_t released = 0, multi_version = 0, truncated = 0, finished = 0, resumed = 0;
  for (int step = 0; step < 10; ++step) {
    if (rollout.scheduler().queued_groups() < 2) rollout.offer_prompts(2);
    const auto st = rollout.step();
    resumed += st.resumed_items;
    const auto& batch = rollout.take_experience();
    REQUIRE(batch.responses.size() == batch.group_ids.size() * 4);
    for (std::size_t i = 0; i < batch.responses.size(); ++i) {
      const auto& r = batch.responses[i];
      INFO("response " << r.info.response_id);
      REQUIRE(r.info.group_id == batch.group_ids[i / 4]);
      REQUIRE(static_cast<std::int64_t>(r.tokens.size()) == r.info.tokens);
      REQUIRE(r.log_probs.size() == r.tokens.size());
      REQUIRE(r.versions.size() == r.tokens.size());
      REQUIRE(r.prompt == task.prompt(r.target));
      // State: finished iff the last token is EOS; truncated iff L_max tokens without EOS.
      const bool ends_eos = r.tokens.back() == rlvr::countdown_task::eos_token;
      CHECK(ends_eos == (r.info.final_state == ulorl::response_state::finished));
      if (!ends_eos) CHECK(r.tokens.size() == 40);
      CHECK(r.result == task.verify(r.target, r.tokens));
      CHECK(r.reward == (r.result == rlvr::verdict::correct ? 1.0 : 0.0));
      // Spans tile the response and each token's engine version is its span's version.
      std::int64_t next = 0;
      for (const auto& s : r.spans) {
        CHECK(s.begin == next);
        for (std::int64_t t = s.begin; t < s.end; ++t) CHECK(r.versions[static_cast<std::size_t>(t)] == s.version);
        next = s.end;
      }
      CHECK(next == r.info.tokens);
      CHECK(r.info.first_version == r.versions.front());
      CHECK(r.info.last_version == r.versions.back());
      // SAIS's per-token old-log-prob version is the version that sampled the token: nothing to
      // recompute when the engine's log-probs are trusted.
      std::vector<std::int64_t> sais(r.tokens.size());
      ulorl::fill_old_log_prob_versions(r.spans, sais, {.mode = ulorl::is_mode::sais, .current_version = batch.policy_version});
      CHECK(sais == r.versions);
      CHECK(ulorl::recompute_token_count(r.spans, {.mode = ulorl::is_mode::sais, .current_version = batch.policy_version}) == 0);
      // Each span's log-probs equal a recompute under that version's weights.
      for (const auto& s : r.spans) {
        load_parameters(policy, weights.at(s.version));
        seq full = r.prompt;
        full.insert(full.end(), r.tokens.begin(), r.tokens.begin() + s.end);
        const auto ref = recompute(policy, {full}, {static_cast<std::int64_t>(r.prompt.size()) + s.begin}, 1.0);
        const std::vector<double> got(r.log_probs.begin() + s.begin, r.log_probs.begin() + s.end);
        CHECK(max_abs_diff(got, ref[0]) <= 1e-5);
      }
      multi_version += r.spans.size() > 1 ? 1 : 0;
      truncated += r.info.final_state == ulorl::response_state::truncated ? 1 : 0;
      finished += r.info.final_state == ulorl::response_state::finished ? 1 : 0;
      ++released;
    }
    // New weights for the next step (the trainer's update), declared to engine and scheduler.
    load_parameters(policy, weights.rbegin()->second);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : policy->parameters()) p.add_(torch::empty_like(p).normal_(0.0, 0.05, gen));
    }
    const auto v = engine.policy_version() + 1;
    weights.emplace(v, rlvr::snapshot_parameters(policy));
    rollout.update_policy(v);
  }
  std::printf("rollout: %lld released (%lld finished, %lld truncated), %lld spanning two versions, %lld resumed items\n",
              static_cast<long long>(released), static_cast<long long>(finished), static_cast<long long>(truncated),
              static_cast<long long>(multi_version), static_cast<long long>(resumed));
  CHECK(released >= 16);
  CHECK(multi_version > 0);
  CHECK(resumed > 0);
  CHECK(finished > 0);
  const auto& c = rollout.scheduler().counters();
  CHECK(c.generated_tokens == c.released_tokens + rollout.scheduler().live_tokens() + c.dropped_tokens);
}
