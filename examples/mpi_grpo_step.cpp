// mpi_grpo_step — one data-parallel GRPO step with ulorl and MPI, exact across processes.
//
// Every rank draws the same global batch (B responses in prompt groups of G) from a fixed seed,
// keeps a random, uneven shard of it (groups span ranks; a rank may hold nothing) and splits its
// shard into micro-batches of random sizes. The step is what a data-parallel trainer does:
//   1. advantages: all-gather (group id, score) of the step's responses, group_advantages on the
//      gathered batch, keep the local responses' values and broadcast them to their tokens;
//   2. normaliser: all-reduce the step's batch_counts once and build the global agg_normalizer;
//   3. loss: policy_loss on every micro-batch with that normaliser; the micro-batch losses are
//      summed and all-reduced, the gradients d loss / d logp scattered into the global [B, T]
//      layout and reduced onto rank 0 (in a trainer they flow into the backward pass instead).
// Rank 0 also computes the full batch's loss and gradient in one call and compares them with the
// data-parallel ones for every aggregation mode, three objectives and three advantage estimators:
// they agree to 1e-12 relative in float64. The last check shows what goes wrong with the
// frameworks' local normaliser (each micro-batch divided by its own token count).
//
// Run: mpirun -np 4 mpi_grpo_step [seed]       exit code 0 when every check passes
#include <mpi.h>

#include <ulorl/advantage.hpp>
#include <ulorl/loss.hpp>
#include <ulorl/presets/trl.hpp>
#include <ulorl/presets/verl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "common/args.hpp"

namespace {

constexpr std::size_t n_groups = 12, group_size = 8, max_response_length = 48;
constexpr double exact_tolerance = 1e-12;  // relative, float64
constexpr double local_min_error = 1e-6;   // a local normaliser must be at least this far off

//! The step's batch, identical on every rank: row b of the [B, T] arrays holds response b's
//! per-token values in its first length[b] slots (T: the longest response).
struct global_batch {
  std::size_t rows = 0, cols = 0;
  std::vector<std::int64_t> group;  // prompt id of each response
  std::vector<double> score;        // verifier reward of each response
  std::vector<std::size_t> length;  // valid tokens of each response
  std::vector<double> logp, old_logp, ref_logp;
};

global_batch draw_batch(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::normal_distribution<double> noise(0.0, 1.0);
  global_batch g;
  g.rows = n_groups * group_size;
  for (std::size_t p = 0; p < n_groups; ++p) {
    // A correctness reward plus a small format reward; every fourth group is all correct with
    // equal scores (a group of zero std).
    const bool solved = p % 4 == 0;
    const double solve_rate = u(rng);
    for (std::size_t k = 0; k < group_size; ++k) {
      g.group.push_back(static_cast<std::int64_t>(1000 + 7 * p));
      g.score.push_back(solved ? 1.0 : (u(rng) < solve_rate ? 1.0 : 0.0) + 0.1 * u(rng));
      // One response in 16 has no valid token (fully masked), the others 1 .. max_response_length.
      g.length.push_back(u(rng) < 1.0 / 16 ? 0 : 1 + static_cast<std::size_t>(u(rng) * max_response_length) %
                                                         max_response_length);
    }
  }
  // The rollout returns responses in completion order, not grouped by prompt.
  std::vector<std::size_t> order(g.rows);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  auto permute = [&](auto& v) {
    auto w = v;
    for (std::size_t i = 0; i < g.rows; ++i) v[i] = w[order[i]];
  };
  permute(g.group), permute(g.score), permute(g.length);

  g.cols = *std::max_element(g.length.begin(), g.length.end());
  g.logp.assign(g.rows * g.cols, 0.0), g.old_logp = g.logp, g.ref_logp = g.logp;
  for (std::size_t b = 0; b < g.rows; ++b)
    for (std::size_t t = 0; t < g.length[b]; ++t) {
      const std::size_t i = b * g.cols + t;
      g.old_logp[i] = -3.0 * u(rng);
      g.logp[i] = g.old_logp[i] + 0.2 * noise(rng);  // ratios beyond both clip bounds
      g.ref_logp[i] = g.old_logp[i] + 0.1 * noise(rng);
    }
  return g;
}

//! Rows of the global batch in the padded layout [rows, T], T the longest of them (as a trainer
//! pads each micro-batch), with its advantages and gradient buffers.
struct micro_batch {
  std::vector<std::size_t> index;  // global response index of each row
  std::size_t cols = 0;
  std::vector<double> logp, old_logp, ref_logp, mask, adv, grad;

  ulorl::token_view<const double> view(const std::vector<double>& v) const {
    const auto stride = static_cast<std::ptrdiff_t>(cols);
    return ulorl::padded(ulorl::matrix_view<const double>(v.data(), index.size(), cols, stride));
  }
  ulorl::token_view<double> view(std::vector<double>& v) {
    const auto stride = static_cast<std::ptrdiff_t>(cols);
    return ulorl::padded(ulorl::matrix_view<double>(v.data(), index.size(), cols, stride));
  }
  ulorl::policy_loss_inputs<double> inputs() const {
    return {.log_prob = view(logp), .old_log_prob = view(old_logp), .advantages = view(adv), .mask = view(mask),
            .ref_log_prob = view(ref_logp)};
  }
};

micro_batch take_rows(const global_batch& g, std::vector<std::size_t> index) {
  micro_batch m;
  m.index = std::move(index);
  for (auto i : m.index) m.cols = std::max(m.cols, g.length[i]);
  m.cols = std::max<std::size_t>(m.cols, 1);
  const std::size_t n = m.index.size() * m.cols;
  m.logp.assign(n, 0.0), m.old_logp = m.logp, m.ref_logp = m.logp, m.mask = m.logp, m.adv = m.logp, m.grad = m.logp;
  for (std::size_t r = 0; r < m.index.size(); ++r)
    for (std::size_t t = 0; t < g.length[m.index[r]]; ++t) {
      const std::size_t src = m.index[r] * g.cols + t, dst = r * m.cols + t;
      m.logp[dst] = g.logp[src], m.old_logp[dst] = g.old_logp[src], m.ref_logp[dst] = g.ref_logp[src];
      m.mask[dst] = 1.0;
    }
  return m;
}

//! Broadcasts per-response advantages to the tokens of `mbs`, whose rows take `adv` in order.
void set_advantages(std::vector<micro_batch>& mbs, std::span<const double> adv, const ulorl::broadcast_config& bc) {
  for (auto& m : mbs) {
    ulorl::broadcast_to_tokens(adv.first(m.index.size()), m.view(std::as_const(m.mask)), m.view(m.adv), bc);
    adv = adv.subspan(m.index.size());
  }
}

//! The step's normaliser of `mode` from the global counts. The constant modes use the configured
//! maximum response length (verl's loss_scale_factor; TRL dr_grpo: B * max_completion_length),
//! never a micro-batch's padded length, which differs between micro-batches.
ulorl::agg_normalizer step_normalizer(ulorl::agg_mode mode, const ulorl::batch_counts& global) {
  const double c = static_cast<double>(max_response_length);
  return ulorl::global_normalizer(mode, global, mode == ulorl::agg_mode::constant ? global.rows * c : c);
}

struct step_result {
  double loss = 0;
  std::vector<double> grad;  // d loss / d logp in the global [B, T] layout (rank 0)
};

//! Runs every local micro-batch with the normaliser `normalizer_of(micro_batch)`, then sums the
//! losses over ranks and reduces the scattered gradients onto rank 0.
template <class NormalizerOf>
step_result data_parallel_step(std::vector<micro_batch>& mbs, ulorl::policy_loss_config cfg, NormalizerOf normalizer_of,
                               const global_batch& g, MPI_Comm comm) {
  step_result r;
  r.grad.assign(g.rows * g.cols, 0.0);
  for (auto& m : mbs) {
    cfg.normalizer = normalizer_of(m);
    r.loss += ulorl::policy_loss(m.inputs(), m.view(m.grad), cfg).loss;
    for (std::size_t row = 0; row < m.index.size(); ++row)
      for (std::size_t t = 0; t < g.length[m.index[row]]; ++t)
        r.grad[m.index[row] * g.cols + t] = m.grad[row * m.cols + t];
  }
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Allreduce(MPI_IN_PLACE, &r.loss, 1, MPI_DOUBLE, MPI_SUM, comm);
  const int n = static_cast<int>(r.grad.size());
  MPI_Reduce(rank == 0 ? MPI_IN_PLACE : r.grad.data(), r.grad.data(), n, MPI_DOUBLE, MPI_SUM, 0, comm);
  return r;
}

//! The reference: the whole batch as one micro-batch, with its own (= the global) counts.
step_result single_process_step(micro_batch& full, ulorl::policy_loss_config cfg, ulorl::agg_mode mode,
                                const global_batch& g) {
  cfg.normalizer = step_normalizer(mode, ulorl::count_batch(full.view(std::as_const(full.mask))));
  step_result r{ulorl::policy_loss(full.inputs(), full.view(full.grad), cfg).loss,
                std::vector<double>(g.rows * g.cols)};
  for (std::size_t b = 0; b < g.rows; ++b)
    for (std::size_t t = 0; t < g.length[b]; ++t) r.grad[b * g.cols + t] = full.grad[b * full.cols + t];
  return r;
}

struct errors {
  double loss, grad;
};
//! |a - b| / max(1, |b|) for the loss; max_i |a_i - b_i| / max_i |b_i| for the gradient.
errors relative_errors(const step_result& a, const step_result& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < b.grad.size(); ++i) {
    diff = std::max(diff, std::abs(a.grad[i] - b.grad[i]));
    scale = std::max(scale, std::abs(b.grad[i]));
  }
  return {std::abs(a.loss - b.loss) / std::max(1.0, std::abs(b.loss)), scale > 0 ? diff / scale : diff};
}

struct estimator {
  const char* name;
  ulorl::advantage_preset preset;
};
struct loss_case {
  const char* objective;
  const char* mode;
  ulorl::objective_config config;
  ulorl::agg_mode agg;
};

//! The step on `comm`; true when every check passes (on every rank).
bool run_step(MPI_Comm comm, std::uint64_t seed) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);

  // ---- the shard: a random, uneven assignment of responses to ranks, in random micro-batches ----
  const global_batch g = draw_batch(seed);
  std::mt19937_64 shared_rng(seed ^ 0x9e3779b97f4a7c15ull);  // the same draws on every rank
  std::vector<double> rank_weight(static_cast<std::size_t>(size));
  for (auto& w : rank_weight) w = static_cast<double>(1 + shared_rng() % 7);
  // With three or more ranks, every other seed leaves one rank without data: it still joins every
  // collective, with empty contributions.
  if (size >= 3 && shared_rng() % 2 == 0) rank_weight[shared_rng() % rank_weight.size()] = 0;
  std::discrete_distribution<int> pick_rank(rank_weight.begin(), rank_weight.end());
  std::vector<int> owner(g.rows);
  for (auto& o : owner) o = pick_rank(shared_rng);

  std::vector<std::size_t> mine;
  for (std::size_t i = 0; i < g.rows; ++i)
    if (owner[i] == rank) mine.push_back(i);
  std::mt19937_64 local_rng(seed + 1 + static_cast<std::uint64_t>(rank));  // differs per rank
  std::shuffle(mine.begin(), mine.end(), local_rng);
  std::vector<micro_batch> mbs;
  for (std::size_t begin = 0; begin < mine.size();) {
    const std::size_t end = std::min(mine.size(), begin + 1 + local_rng() % 6);
    mbs.push_back(take_rows(g, {mine.begin() + static_cast<std::ptrdiff_t>(begin),
                                mine.begin() + static_cast<std::ptrdiff_t>(end)}));
    begin = end;
  }

  // ---- 1. advantages: all-gather (group id, score), then the group statistics of the whole step --
  // Rank r's responses land at displs[r] .. displs[r] + counts[r] of the gathered batch, in the
  // order of `mine`, which is also the order of its micro-batches' rows.
  const int n_local = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<std::size_t>(size)), displs(static_cast<std::size_t>(size), 0);
  MPI_Allgather(&n_local, 1, MPI_INT, counts.data(), 1, MPI_INT, comm);
  std::partial_sum(counts.begin(), counts.end() - 1, displs.begin() + 1);
  std::vector<std::int64_t> my_ids, all_ids(g.rows);
  std::vector<double> my_scores, all_scores(g.rows);
  for (auto i : mine) my_ids.push_back(g.group[i]), my_scores.push_back(g.score[i]);
  MPI_Allgatherv(my_ids.data(), n_local, MPI_INT64_T, all_ids.data(), counts.data(), displs.data(), MPI_INT64_T, comm);
  MPI_Allgatherv(my_scores.data(), n_local, MPI_DOUBLE, all_scores.data(), counts.data(), displs.data(), MPI_DOUBLE,
                 comm);

  // ---- 2. the step's counts, all-reduced once ----------------------------------------------------
  ulorl::batch_counts local;
  for (const auto& m : mbs) local += ulorl::count_batch(m.view(m.mask));
  double c[3] = {local.tokens, local.sequences, local.rows};
  MPI_Allreduce(MPI_IN_PLACE, c, 3, MPI_DOUBLE, MPI_SUM, comm);
  const ulorl::batch_counts global{.tokens = c[0], .sequences = c[1], .rows = c[2]};

  const estimator estimators[] = {{"verl GRPO", ulorl::presets::verl::grpo_advantage()},
                                  {"verl RLOO", ulorl::presets::verl::rloo_advantage()},
                                  {"Dr. GRPO", ulorl::presets::verl::grpo_advantage({.norm_adv_by_std_in_grpo = false})}};
  // PPO with DAPO's clip-higher, GSPO (verl's sequence ratio; verl forces seq-mean-token-mean) and
  // GMPO (a mean over sequences), each with verl's k3 KL against the reference policy. GSPO's clip
  // range is wider than the paper's 3e-4 / 4e-4 so that this batch's noise leaves rows unclipped.
  const ulorl::objective_config ppo{.eps_low = 0.2, .eps_high = 0.28};
  namespace verl = ulorl::presets::verl;
  const auto gspo = verl::objective({.loss_mode = verl::loss_mode_kind::gspo, .clip_ratio_low = 0.03, .clip_ratio_high = 0.04});
  const auto gmpo = verl::objective({.loss_mode = verl::loss_mode_kind::geo_mean, .clip_ratio_low = 0.4, .clip_ratio_high = 0.4});
  using ulorl::agg_mode;
  const loss_case cases[] = {{"ppo clip-higher", "token-mean", ppo, agg_mode::token_mean},
                             {"ppo clip-higher", "seq-mean-token-sum", ppo, agg_mode::seq_mean_token_sum},
                             {"ppo clip-higher", "seq-mean-token-mean", ppo, agg_mode::seq_mean_token_mean},
                             {"ppo clip-higher", "seq-mean-token-sum-norm", ppo, agg_mode::seq_mean_token_sum_norm},
                             {"ppo clip-higher", "constant (Dr. GRPO)", ppo, agg_mode::constant},
                             {"gspo", "seq-mean-token-mean", gspo, agg_mode::seq_mean_token_mean},
                             {"gmpo", "seq-mean-token-sum", gmpo, agg_mode::seq_mean_token_sum}};
  const ulorl::policy_loss_config base{.kl = verl::kl({.kl_penalty = ulorl::kl_estimator::k3}), .kl_coef = 0.01};

  // The single-process reference: the whole batch as one micro-batch, on rank 0.
  std::vector<micro_batch> full;
  if (rank == 0) {
    std::vector<std::size_t> all(g.rows);
    std::iota(all.begin(), all.end(), 0);
    full.push_back(take_rows(g, std::move(all)));
  }

  // Shard summary: responses, micro-batches and tokens of each rank; groups split across ranks.
  double shard[3] = {static_cast<double>(mine.size()), static_cast<double>(mbs.size()), local.tokens};
  std::vector<double> shards(3 * static_cast<std::size_t>(size));
  MPI_Gather(shard, 3, MPI_DOUBLE, shards.data(), 3, MPI_DOUBLE, 0, comm);
  std::map<std::int64_t, std::set<int>> owners_of_group;
  for (std::size_t i = 0; i < g.rows; ++i) owners_of_group[g.group[i]].insert(owner[i]);
  const auto spanning = std::count_if(owners_of_group.begin(), owners_of_group.end(),
                                      [](const auto& kv) { return kv.second.size() > 1; });
  bool ok = size == 1 || spanning > 0;
  if (rank == 0) {
    std::printf("ulorl data-parallel GRPO step: seed %llu, %d ranks, B = %zu (%zu groups of %zu), T = %zu, "
                "N = %.0f tokens, S = %.0f sequences\n",
                static_cast<unsigned long long>(seed), size, g.rows, n_groups, group_size, g.cols, global.tokens,
                global.sequences);
    for (int r = 0; r < size; ++r)
      std::printf("  rank %d: %3.0f responses in %2.0f micro-batches, %5.0f tokens\n", r, shards[3 * r],
                  shards[3 * r + 1], shards[3 * r + 2]);
    std::printf("  %td of %zu groups span ranks%s\n\n", spanning, n_groups, ok ? "" : "  FAIL: none");
    std::printf("%-10s %-16s %-24s %14s %12s %12s\n", "advantage", "objective", "aggregation", "loss",
                "rel err loss", "rel err grad");
  }

  double worst_loss = 0, worst_grad = 0;
  for (const auto& est : estimators) {
    std::vector<double> adv(g.rows);
    ulorl::group_advantages(std::span<const double>(all_scores), std::span<const std::int64_t>(all_ids),
                            std::span<double>(adv), est.preset.group);
    const auto my_first = static_cast<std::size_t>(displs[static_cast<std::size_t>(rank)]);
    set_advantages(mbs, std::span<const double>(adv).subspan(my_first, mine.size()), est.preset.broadcast);
    if (rank == 0) {
      std::vector<double> full_adv(g.rows);
      ulorl::group_advantages(std::span<const double>(g.score), std::span<const std::int64_t>(g.group),
                              std::span<double>(full_adv), est.preset.group);
      set_advantages(full, full_adv, est.preset.broadcast);
    }

    // ---- 3. every micro-batch with the step's normaliser; 4. rank 0 compares with one process ----
    for (const auto& lc : cases) {
      auto cfg = base;
      cfg.objective = lc.config;
      const auto norm = step_normalizer(lc.agg, global);
      const auto dp = data_parallel_step(mbs, cfg, [&](const micro_batch&) { return norm; }, g, comm);
      if (rank != 0) continue;
      const auto e = relative_errors(dp, single_process_step(full[0], cfg, lc.agg, g));
      const bool pass = e.loss <= exact_tolerance && e.grad <= exact_tolerance;
      ok = ok && pass;
      worst_loss = std::max(worst_loss, e.loss), worst_grad = std::max(worst_grad, e.grad);
      std::printf("%-10s %-16s %-24s %14.9f %12.3e %12.3e%s\n", est.name, lc.objective, lc.mode, dp.loss, e.loss,
                  e.grad, pass ? "" : "  FAIL");
    }

    // ---- 5. the frameworks' local normaliser: each micro-batch divides by its own token count ----
    // TRL's bnpo with gradient accumulation over this rank's micro-batches, then DDP's mean over
    // ranks: exact only when every micro-batch holds the same number of tokens.
    auto cfg = base;
    cfg.objective = ppo;
    const double accumulation_steps = static_cast<double>(mbs.size());
    auto local_normalizer = [&](const micro_batch& m) {
      namespace trl = ulorl::presets::trl;
      auto n = trl::normalizer({.loss_type = trl::loss_type_kind::bnpo,
                                .max_completion_length = static_cast<double>(max_response_length),
                                .gradient_accumulation_steps = accumulation_steps,
                                .num_processes = static_cast<double>(size)},
                               ulorl::count_batch(m.view(m.mask)));
      n.scale /= size;
      return n;
    };
    const auto dp = data_parallel_step(mbs, cfg, local_normalizer, g, comm);
    if (rank == 0) {
      const auto e = relative_errors(dp, single_process_step(full[0], cfg, agg_mode::token_mean, g));
      const bool pass = e.loss > local_min_error && e.grad > local_min_error;
      ok = ok && pass;
      std::printf("%-10s %-16s %-24s %14.9f %12.3e %12.3e  expected > %.0e%s\n", est.name, "ppo clip-higher",
                  "token-mean, local N", dp.loss, e.loss, e.grad, local_min_error, pass ? "" : "  FAIL: matches");
    }
  }

  if (rank == 0)
    std::printf("\nglobal normaliser: max rel err loss %.3e, gradient %.3e (tolerance %.0e): %s\n", worst_loss,
                worst_grad, exact_tolerance, ok ? "PASS" : "FAIL");
  int all_ok = ok ? 1 : 0;
  MPI_Bcast(&all_ok, 1, MPI_INT, 0, comm);
  return all_ok != 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  // One optional argument, the seed: a whole number (examples/common/args.hpp), else exit status 2
  // on every rank (each parses the same command line).
  std::uint64_t seed = 20250917;
  const int parsed = cli::run("mpi_grpo_step", [&] {
    cli::reader args(argc, argv);
    if (args.next()) {
      if (args.flag().substr(0, 1) == "-") args.unknown();
      seed = cli::integer<std::uint64_t>("SEED", args.flag(), 0, UINT64_MAX);
      if (args.next()) args.unknown();
    }
    return 0;
  });
  if (parsed != 0) {
    MPI_Finalize();
    return parsed;
  }
  bool ok = false;
  try {
    ok = run_step(MPI_COMM_WORLD, seed);
  } catch (const std::exception& e) {
    // The other ranks would wait in their next collective forever: take the whole job down.
    std::fprintf(stderr, "mpi_grpo_step: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return cli::run("mpi_grpo_step", [&] { return ok ? 0 : 1; });  // flushes and checks the standard output
}
