// engine.hpp — a batched autoregressive decoding engine over the policy's KV cache.
//
// generate() takes decode requests (a context = prompt + committed response tokens, and a quota of
// new tokens) and runs them with continuous batching:
//   * the cache has `max_batch` rows; active sequences occupy rows [0, b);
//   * between iterations, waiting requests join: their contexts are prefilled as one right-padded
//     batch under the current weights (a new response prefills its prompt; a paused one re-prefills
//     prompt + response so far, its old KV cache having been computed under older weights), and the
//     prefill's last logits give their first new token;
//   * each decode iteration feeds every active row its last sampled token and samples the next;
//   * a sequence leaves at EOS or when its quota is spent; the last row moves into its place
//     (only that row's prefix is copied), so the batch stays dense.
// Sampling is temperature sampling by inverse CDF from the counter-based uniform
// counter_uniform(seed, stream, sequence_id, response_index): a sequence samples the same tokens
// whether it runs alone or batched, whole or resumed, whenever the weights (and so its logits)
// agree. Each token's log-prob under the sampling distribution, log softmax(z / T), is recorded.
// set_greedy(true) takes the most likely token instead (greedy validation); nothing else changes.
//
// Costs are measured per call in the terms of ulorl/rollout/simulator.hpp's decode_engine_model:
//   decode iteration  tau(b, C) = t_iter + t_seq * b + t_kv * C   (b rows, C cached tokens read: the
//                     attention is padded to the longest row, so C = b * C_max, the simulator's padded_kv)
//   prefill           t_prefill per context token
// engine_costs accumulates the least-squares normal equations of tau over every iteration, so
// fitted_model() returns the matching decode_engine_model without storing samples.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <ulorl/rollout/simulator.hpp>

#include "policy.hpp"
#include "rng.hpp"

namespace rlvr {

struct engine_config {
  std::int64_t max_batch = 64;          //!< KV-cache rows: sequences decoded at once
  double temperature = 1.0;             //!< > 0
  std::int64_t eos_token = 19;
  std::uint64_t seed = 1;               //!< sampling seed (with stream, sequence id, token index)
  std::int64_t max_prefill_tokens = 8192;  //!< padded tokens per prefill batch (bounds the [n, T, T] scores)
};

//! Decode at most `max_new_tokens` after `context`.
struct decode_request {
  std::int64_t sequence_id = 0;            //!< selects the sampling stream (the response id)
  std::span<const std::int64_t> context;   //!< prompt + committed response tokens (>= 1 token)
  std::int64_t first_index = 0;            //!< index within the response of the first new token
  std::int64_t max_new_tokens = 0;
  std::uint64_t stream = 0;                //!< separates independent uses of one seed (training, validation)
};

struct decode_result {
  std::int64_t sequence_id = 0;
  std::vector<std::int64_t> tokens;   //!< new tokens, EOS included when reached
  std::vector<double> log_probs;       //!< log softmax(z / T) of each new token
  bool eos = false;
};

//! Measured costs, cumulative since construction or reset().
struct engine_costs {
  std::int64_t decode_iterations = 0;
  std::int64_t decoded_tokens = 0;      //!< tokens sampled by decode iterations
  std::int64_t context_tokens = 0;      //!< sum over iterations of C (cached tokens read: b x the longest cache)
  double decode_s = 0;                  //!< forward + sampling of decode iterations
  std::int64_t prefill_calls = 0;
  std::int64_t prefill_tokens = 0;      //!< real context tokens prefilled
  std::int64_t prefill_padded_tokens = 0;
  std::int64_t prefill_sampled = 0;     //!< first tokens sampled from prefill logits
  double prefill_s = 0;
  // Normal equations of tau = a + b_coef * b + c_coef * C: sums of x x^T and x y over x = (1, b, C).
  std::array<double, 9> xtx{};
  std::array<double, 3> xty{};

  void add_iteration(std::int64_t rows, std::int64_t context, double seconds) noexcept {
    const double x[3] = {1.0, static_cast<double>(rows), static_cast<double>(context)};
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) xtx[static_cast<std::size_t>(3 * i + j)] += x[i] * x[j];
      xty[static_cast<std::size_t>(i)] += x[i] * seconds;
    }
    ++decode_iterations;
    decoded_tokens += rows;
    context_tokens += context;
    decode_s += seconds;
  }
  [[nodiscard]] double decode_tokens_per_s() const noexcept { return decode_s > 0 ? static_cast<double>(decoded_tokens) / decode_s : 0; }
  [[nodiscard]] double prefill_tokens_per_s() const noexcept { return prefill_s > 0 ? static_cast<double>(prefill_tokens) / prefill_s : 0; }
};

//! A fitted cost as the simulator takes it: 0 or in [rollout_sim_limits::min_cost_s, max_cost_s]
//! (a residue of the fit below an attosecond is 0).
[[nodiscard]] inline double simulator_cost(double seconds) noexcept {
  using lim = ulorl::rollout_sim_limits;
  return seconds >= lim::min_cost_s ? std::min(seconds, lim::max_cost_s) : 0.0;
}

//! Least-squares fit of tau(b, C) = t_iter + t_seq b + t_kv C over the measured iterations, and the
//! prefill cost per context token (its per-call overhead included). A coefficient the data cannot
//! separate (e.g. every iteration at the same batch size) or that comes out negative is refitted
//! without it, so the model never predicts negative time.
[[nodiscard]] inline ulorl::decode_engine_model fit_engine_model(const engine_costs& c) {
  ulorl::decode_engine_model m;
  m.rebuild_kv_on_resume = true;  // the engine always re-prefills a resumed response
  m.padded_kv = true;             // and attends over every row up to the longest cache
  m.prefill_token_s = c.prefill_tokens > 0 ? c.prefill_s / static_cast<double>(c.prefill_tokens) : 0.0;
  std::array<bool, 3> use{true, true, true};
  std::array<double, 3> coef{};
  for (int pass = 0; pass < 3; ++pass) {
    // Solve the normal equations restricted to the used coefficients (Gaussian elimination, pivoting).
    std::array<int, 3> idx{};
    int n = 0;
    for (int i = 0; i < 3; ++i)
      if (use[static_cast<std::size_t>(i)]) idx[static_cast<std::size_t>(n++)] = i;
    double a[3][4] = {};
    for (int r = 0; r < n; ++r) {
      for (int s = 0; s < n; ++s) a[r][s] = c.xtx[static_cast<std::size_t>(3 * idx[static_cast<std::size_t>(r)] + idx[static_cast<std::size_t>(s)])];
      a[r][n] = c.xty[static_cast<std::size_t>(idx[static_cast<std::size_t>(r)])];
    }
    bool singular = false;
    for (int col = 0; col < n && !singular; ++col) {
      int piv = col;
      for (int r = col + 1; r < n; ++r)
        if (std::abs(a[r][col]) > std::abs(a[piv][col])) piv = r;
      if (std::abs(a[piv][col]) <= 1e-12 * std::max(1.0, std::abs(a[0][0]))) {
        singular = true;
        break;
      }
      for (int s = 0; s <= n; ++s) std::swap(a[col][s], a[piv][s]);
      for (int r = 0; r < n; ++r) {
        if (r == col) continue;
        const double f = a[r][col] / a[col][col];
        for (int s = col; s <= n; ++s) a[r][s] -= f * a[col][s];
      }
    }
    coef = {};
    if (!singular)
      for (int r = 0; r < n; ++r) coef[static_cast<std::size_t>(idx[static_cast<std::size_t>(r)])] = a[r][n] / a[r][r];
    // Drop the last-listed coefficient that is unusable (context first, then batch) and refit.
    int drop = -1;
    for (int i = 2; i >= 1; --i)
      if (use[static_cast<std::size_t>(i)] && (singular || coef[static_cast<std::size_t>(i)] < 0)) {
        drop = i;
        break;
      }
    if (drop < 0) break;
    use[static_cast<std::size_t>(drop)] = false;
  }
  m.iteration_s = simulator_cost(coef[0]);
  m.per_sequence_s = simulator_cost(coef[1]);
  m.per_context_token_s = simulator_cost(coef[2]);
  m.prefill_token_s = simulator_cost(m.prefill_token_s);
  return m;
}

//! The fitted model as segment_rollout_sim's cost flags (its --engine model).
[[nodiscard]] inline std::string simulator_flags(const ulorl::decode_engine_model& m) {
  char b[192];
  std::snprintf(b, sizeof b, "--iteration-ms %.4f --per-seq-us %.3f --kv-ns %.3f --prefill-us %.3f%s%s", m.iteration_s * 1e3,
                m.per_sequence_s * 1e6, m.per_context_token_s * 1e9, m.prefill_token_s * 1e6,
                m.padded_kv ? " --padded-kv" : "", m.rebuild_kv_on_resume ? "" : " --no-kv-rebuild");
  return b;
}

//! Measured update costs: one (trained tokens, seconds) point per training step, as the normal
//! equations of seconds = t_step + t_token * tokens (the simulator's trainer_model).
struct trainer_costs {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  void add_step(double tokens, double seconds) noexcept {
    n += 1;
    sx += tokens;
    sy += seconds;
    sxx += tokens * tokens;
    sxy += tokens * seconds;
  }
};

//! Least-squares fit of the update time per step, t_step + t_token * tokens. When the steps' token
//! counts barely vary (the two terms cannot be separated) or a term comes out negative, the fit keeps
//! one term: all of it per token (through the origin) or, failing that, all of it per step.
[[nodiscard]] inline ulorl::trainer_model fit_trainer_model(const trainer_costs& c) {
  ulorl::trainer_model m{.per_token_s = 0, .per_step_s = 0};
  if (c.n <= 0) return m;
  const double var = c.sxx - c.sx * c.sx / c.n;  // n * variance of the token counts
  if (c.n >= 2 && var > 1e-6 * c.sxx) {
    const double slope = (c.sxy - c.sx * c.sy / c.n) / var;
    const double intercept = (c.sy - slope * c.sx) / c.n;
    if (slope >= 0 && intercept >= 0) return {.per_token_s = simulator_cost(slope), .per_step_s = simulator_cost(intercept)};
  }
  if (c.sxx > 0 && c.sxy >= 0) return {.per_token_s = simulator_cost(c.sxy / c.sxx), .per_step_s = 0};
  return {.per_token_s = 0, .per_step_s = simulator_cost(c.sy / c.n)};
}

//! The fitted trainer as segment_rollout_sim's flags.
[[nodiscard]] inline std::string simulator_flags(const ulorl::trainer_model& m) {
  char b[96];
  std::snprintf(b, sizeof b, "--train-token-us %.4f --train-step-s %.4f", m.per_token_s * 1e6, m.per_step_s);
  return b;
}

class decode_engine {
 public:
  decode_engine(transformer_policy policy, const engine_config& config)
      : policy_(std::move(policy)), c_(config) {
    if (c_.max_batch < 1) throw std::invalid_argument("decode_engine: max_batch must be >= 1");
    if (!(c_.temperature > 0)) throw std::invalid_argument("decode_engine: temperature must be > 0");
    if (c_.max_prefill_tokens < policy_->config().max_seq)
      throw std::invalid_argument("decode_engine: max_prefill_tokens must hold one max_seq context");
    cache_ = policy_->make_cache(c_.max_batch);
  }

  [[nodiscard]] const engine_config& config() const noexcept { return c_; }
  [[nodiscard]] const engine_costs& costs() const noexcept { return costs_; }
  void reset_costs() noexcept { costs_ = {}; }
  [[nodiscard]] transformer_policy& policy() noexcept { return policy_; }

  //! The version of the weights the engine decodes with. The weights are the policy module's own
  //! (shared with the trainer); the host declares each change here, strictly increasing.
  [[nodiscard]] std::int64_t policy_version() const noexcept { return version_; }
  void set_policy_version(std::int64_t v) {
    if (v <= version_)
      throw std::invalid_argument("decode_engine::set_policy_version: versions must increase (current " +
                                  std::to_string(version_) + ", got " + std::to_string(v) + ")");
    version_ = v;
  }

  //! Greedy decoding (the most likely token, the first of equals) instead of sampling; the recorded
  //! log-probs stay those of softmax(z / T).
  void set_greedy(bool on) noexcept { greedy_ = on; }
  [[nodiscard]] bool greedy() const noexcept { return greedy_; }

  //! Decodes every request; out[i] is the result of reqs[i].
  void generate(std::span<const decode_request> reqs, std::vector<decode_result>& out) {
    torch::NoGradGuard no_grad;
    const auto max_seq = policy_->config().max_seq;
    out.assign(reqs.size(), decode_result{});
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      const auto& r = reqs[i];
      const auto ctx = static_cast<std::int64_t>(r.context.size());
      if (ctx < 1) throw std::invalid_argument("decode_engine::generate: request " + std::to_string(i) + " has an empty context");
      if (r.max_new_tokens < 0) throw std::invalid_argument("decode_engine::generate: negative max_new_tokens");
      // The last new token is sampled, never fed, so the cache holds at most ctx + max_new - 1 tokens.
      if (ctx + r.max_new_tokens - 1 > max_seq)
        throw std::invalid_argument("decode_engine::generate: request " + std::to_string(i) + " needs " +
                                    std::to_string(ctx + r.max_new_tokens - 1) + " cached tokens, max_seq is " +
                                    std::to_string(max_seq));
      out[i].sequence_id = r.sequence_id;
      out[i].tokens.reserve(static_cast<std::size_t>(r.max_new_tokens));
      out[i].log_probs.reserve(static_cast<std::size_t>(r.max_new_tokens));
    }
    rows_.clear();
    waiting_.clear();
    for (std::size_t i = 0; i < reqs.size(); ++i)
      if (reqs[i].max_new_tokens > 0) waiting_.push_back(i);
    std::size_t next = 0;
    while (next < waiting_.size() || !rows_.empty()) {
      next = admit(reqs, next, out);
      if (!rows_.empty()) decode_iteration(reqs, out);
    }
  }

 private:
  struct row_state {
    std::size_t request = 0;   // index into the request span
    std::int64_t cached = 0;   // tokens of this sequence in its cache row
    std::int64_t last = 0;     // last sampled token (fed by the next iteration)
  };

  // Prefills waiting requests into free rows (batches bounded by max_prefill_tokens padded tokens)
  // and samples their first token. `next` indexes waiting_; returns the first still waiting.
  std::size_t admit(std::span<const decode_request> reqs, std::size_t next, std::vector<decode_result>& out) {
    while (next < waiting_.size() && static_cast<std::int64_t>(rows_.size()) < c_.max_batch) {
      const auto first = static_cast<std::int64_t>(rows_.size());
      std::int64_t n = 0, longest = 0;
      while (next + static_cast<std::size_t>(n) < waiting_.size() && first + n < c_.max_batch) {
        const auto len = static_cast<std::int64_t>(reqs[waiting_[next + static_cast<std::size_t>(n)]].context.size());
        if (n > 0 && std::max(longest, len) * (n + 1) > c_.max_prefill_tokens) break;
        longest = std::max(longest, len);
        ++n;
      }
      const auto t0 = std::chrono::steady_clock::now();
      auto tokens = torch::zeros({n, longest}, torch::kInt64);
      auto lengths = torch::empty({n}, torch::kInt64);
      auto tok = tokens.accessor<std::int64_t, 2>();
      auto len = lengths.accessor<std::int64_t, 1>();
      std::int64_t real = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const auto request = waiting_[next + static_cast<std::size_t>(i)];
        const auto& ctx = reqs[request].context;
        for (std::size_t t = 0; t < ctx.size(); ++t) tok[i][static_cast<std::int64_t>(t)] = ctx[t];
        len[i] = static_cast<std::int64_t>(ctx.size());
        real += len[i];
        rows_.push_back({request, len[i], 0});
      }
      next += static_cast<std::size_t>(n);
      const auto logits = policy_->prefill(tokens, lengths, cache_, first);
      sample_rows(reqs, out, logits, first);
      costs_.prefill_calls += 1;
      costs_.prefill_tokens += real;
      costs_.prefill_padded_tokens += n * longest;
      costs_.prefill_sampled += n;
      costs_.prefill_s += seconds_since(t0);
      compact(reqs, out);
    }
    return next;
  }

  void decode_iteration(std::span<const decode_request> reqs, std::vector<decode_result>& out) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto b = static_cast<std::int64_t>(rows_.size());
    auto tokens = torch::empty({b}, torch::kInt64);
    auto positions = torch::empty({b}, torch::kInt64);
    auto tok = tokens.accessor<std::int64_t, 1>();
    auto pos = positions.accessor<std::int64_t, 1>();
    std::int64_t context = 0;
    for (std::int64_t i = 0; i < b; ++i) {
      const auto& r = rows_[static_cast<std::size_t>(i)];
      tok[i] = r.last;
      pos[i] = r.cached;
      context = std::max(context, r.cached + 1);
    }
    // Attention runs over every row up to the longest cache (padded): b * C_max cached tokens read.
    const std::int64_t read = b * (context - 1);
    const auto logits = policy_->decode(tokens, positions, cache_, context);
    for (auto& r : rows_) ++r.cached;
    sample_rows(reqs, out, logits, 0);
    costs_.add_iteration(b, read, seconds_since(t0));
    compact(reqs, out);
  }

  // Samples one token for rows [first, first + logits.size(0)) from their logits.
  void sample_rows(std::span<const decode_request> reqs, std::vector<decode_result>& out, const torch::Tensor& logits,
                   std::int64_t first) {
    const auto logp = torch::log_softmax(logits.to(torch::kFloat64) / c_.temperature, -1).contiguous();
    const auto lp = logp.accessor<double, 2>();
    const auto V = logp.size(1);
    for (std::int64_t i = 0; i < logp.size(0); ++i) {
      auto& row = rows_[static_cast<std::size_t>(first + i)];
      const auto& req = reqs[row.request];
      auto& res = out[row.request];
      const auto index = req.first_index + static_cast<std::int64_t>(res.tokens.size());
      const double u = counter_uniform(c_.seed, req.stream, static_cast<std::uint64_t>(req.sequence_id),
                                       static_cast<std::uint64_t>(index));
      std::int64_t token = -1;
      if (greedy_) {
        // The most likely token (the first of equals).
        token = 0;
        for (std::int64_t v = 1; v < V; ++v)
          if (lp[i][v] > lp[i][token]) token = v;
      } else {
        // Inverse CDF; rounding can leave the total just below u, then the last token of nonzero mass.
        double cdf = 0;
        for (std::int64_t v = 0; v < V; ++v) {
          const double p = std::exp(lp[i][v]);
          if (p > 0) token = v;
          cdf += p;
          if (u < cdf && p > 0) break;
        }
      }
      row.last = token;
      res.tokens.push_back(token);
      res.log_probs.push_back(lp[i][token]);
      if (token == c_.eos_token) res.eos = true;
    }
  }

  // Removes finished rows: the last live row moves into each hole (only its cached prefix is
  // copied), so live rows stay in [0, b) without moving the others.
  void compact(std::span<const decode_request> reqs, const std::vector<decode_result>& out) {
    auto done = [&](const row_state& r) {
      const auto& res = out[r.request];
      return res.eos || static_cast<std::int64_t>(res.tokens.size()) >= reqs[r.request].max_new_tokens;
    };
    std::size_t n = rows_.size();
    for (std::size_t i = 0; i < n;) {
      if (!done(rows_[i])) {
        ++i;
        continue;
      }
      while (n > i + 1 && done(rows_[n - 1])) --n;
      if (n == i + 1) {  // row i is the last one left and it is done
        n = i;
        break;
      }
      cache_.move_row(static_cast<std::int64_t>(n - 1), static_cast<std::int64_t>(i), rows_[n - 1].cached);
      rows_[i] = rows_[n - 1];
      --n;
      ++i;
    }
    rows_.resize(n);
  }

  static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  transformer_policy policy_;
  engine_config c_;
  kv_cache cache_;
  std::vector<row_state> rows_;       // active sequences, row i of the cache
  std::vector<std::size_t> waiting_;  // requests with a quota, in submission order
  engine_costs costs_;
  std::int64_t version_ = 0;
  bool greedy_ = false;
};

}  // namespace rlvr
