// Training checkpoints of the libtorch trainer (examples/rlvr_trainer: checkpoint.hpp, and the save /
// load of training_loop, grpo_trainer and segment_rollout). A run of K + M steps straight through
// and a run of K steps, saved, rebuilt from scratch (another initial weight seed), loaded and run M
// more steps give bit-identical per-step numbers (losses, KL, beta, entropies, rewards, clipping,
// gradient norms, validation, resets) and bit-identical final weights, reference weights, AdamW
// state, controllers and scheduler. Three segments, so responses are in flight across the save;
// the adaptive KL controller and plateau resets active, POIS and SAIS, from a briefly warmed-up
// policy (some responses right, so advantages are not all zero). One intra-op thread
// (torch::set_num_threads(1)): the comparison is bitwise. Then the file's checks: truncated,
// corrupted, foreign and missing files, another model size and another configuration are refused
// with an error, and a refused load changes nothing.
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "catch.hpp"
#include "checkpoint.hpp"
#include "engine.hpp"
#include "policy.hpp"
#include "rollout.hpp"
#include "task.hpp"
#include "trainer.hpp"
#include "warmup.hpp"

namespace {

using rlvr::countdown_task;

struct run_options {
  std::uint64_t init_seed = 9;  //!< initial weights (a loaded checkpoint replaces them)
  bool warm = true;             //!< start from warm_weights() (needs the default d_model)
  std::int64_t d_model = 32;
  rlvr::old_policy is = rlvr::old_policy::pois;
  double lr = 1e-3;
};

countdown_task test_task() { return countdown_task({.max_target = 30, .max_response_tokens = 48, .seed = 3}); }

rlvr::policy_config test_policy(std::uint64_t seed, std::int64_t d_model) {
  return {.vocab_size = countdown_task::vocab_size, .d_model = d_model, .n_heads = 2, .n_layers = 1, .d_mlp = 64,
          .max_seq = test_task().max_sequence_tokens(), .seed = seed};
}

//! The default-size policy after a short supervised warm-up on the test's task, so that some
//! responses are right and the groups' advantages are not all zero (computed once).
const std::vector<torch::Tensor>& warm_weights() {
  static const std::vector<torch::Tensor> w = [] {
    const auto task = test_task();
    rlvr::transformer_policy p(test_policy(9, 32));
    rlvr::supervised_warmup warm(p, task, {.steps = 150, .batch = 32, .lr = 3e-3, .max_answer_tokens = 44, .seed = 5});
    for (int s = 0; s < 150; ++s) (void)warm.step();
    return rlvr::snapshot_parameters(p);
  }();
  return w;
}

//! Everything one training run holds, built as a driver builds it.
struct run {
  explicit run(const run_options& o)
      : task(test_task()),
        policy(warmed(o)),
        engine(policy, {.max_batch = 16, .temperature = 1.0, .eos_token = countdown_task::eos_token, .seed = 3}),
        trainer(policy, config(o)),
        rollout(task, engine,
                {.group_size = 4, .max_response_tokens = 48, .num_segments = 3, .max_active_responses = 16,
                 .release_batch_groups = 2},
                [this](std::int64_t g) { return task.training_target(static_cast<std::uint64_t>(g)); }),
        loop(trainer, rollout, {.prompts_per_step = 2, .validate_every = 1},
             [this] { return rlvr::sampled_accuracy(task, engine, task.validation_targets(8)); }) {
    policy->eval();
  }

  static rlvr::transformer_policy warmed(const run_options& o) {
    rlvr::transformer_policy p(test_policy(o.init_seed, o.d_model));
    if (o.warm) rlvr::load_parameters(p, warm_weights());
    return p;
  }

  static rlvr::trainer_config config(const run_options& o) {
    rlvr::trainer_config c;
    c.lr = o.lr;
    c.lr_warmup_steps = 5;       // the ramp is part way up at the save
    c.dynamic_sampling = false;  // keep every group, so that every step updates
    c.mini_batches = 2;
    c.is = o.is;
    // A reset whenever a validation does not beat the best, at most every 2 steps.
    c.resets = {.on_plateau = true, .patience = 1, .min_delta = 0.0, .cooldown_steps = 2};
    return c;
  }

  countdown_task task;
  rlvr::transformer_policy policy;
  rlvr::decode_engine engine;
  rlvr::grpo_trainer trainer;
  rlvr::segment_rollout rollout;
  rlvr::training_loop loop;
};

//! Every number of a step report (bit patterns compared with ==).
std::vector<double> numbers(const rlvr::step_report& r) {
  const auto& t = r.train;
  std::vector<double> v{static_cast<double>(r.step), static_cast<double>(r.rollout_steps),
                        static_cast<double>(r.new_tokens), t.updated ? 1.0 : 0.0, static_cast<double>(t.responses),
                        static_cast<double>(t.kept_responses), static_cast<double>(t.kept_groups), t.reward_mean,
                        t.tokens, t.loss_tokens, t.mpt_masked, t.entropy_mean, t.loss, t.pg_loss, t.kl_loss, t.kl_mean,
                        t.kl_coef, t.clip_fraction, t.ratio_max, t.grad_norm, r.validated ? 1.0 : 0.0, r.validation,
                        r.reset ? 1.0 : 0.0};
  for (const auto L : r.lengths) v.push_back(static_cast<double>(L));
  return v;
}

void check_same_tensors(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << i);
    CHECK(torch::equal(a[i], b[i]));
  }
}

//! AdamW's per-parameter step counts and moments, in parameter order (none: not stepped).
std::vector<torch::Tensor> adam_state(run& r) {
  std::vector<torch::Tensor> out;
  auto& opt = r.trainer.optimizer();
  for (const auto& p : r.policy->parameters()) {
    const auto it = opt.state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
    if (it == opt.state().end()) {
      out.push_back(torch::full({1}, -1, torch::kInt64));
      continue;
    }
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    out.push_back(torch::full({1}, s.step(), torch::kInt64));
    out.push_back(s.exp_avg());
    out.push_back(s.exp_avg_sq());
  }
  return out;
}

//! Paused responses holding tokens: work in flight between steps.
std::int64_t paused_with_tokens(const ulorl::segment_scheduler& s) {
  std::int64_t n = 0;
  for (const auto& r : s.state().responses) n += (r.state == ulorl::response_state::paused && r.tokens > 0) ? 1 : 0;
  return n;
}

void check_same_state(run& a, run& b) {
  check_same_tensors(rlvr::snapshot_parameters(a.policy), rlvr::snapshot_parameters(b.policy));
  check_same_tensors(rlvr::snapshot_parameters(a.trainer.reference()), rlvr::snapshot_parameters(b.trainer.reference()));
  check_same_tensors(adam_state(a), adam_state(b));
  CHECK(a.trainer.optimizer_steps() == b.trainer.optimizer_steps());
  const bool same_kl = a.trainer.kl_controller().save() == b.trainer.kl_controller().save();
  const bool same_resets = a.trainer.reset_policy().save() == b.trainer.reset_policy().save();
  CHECK(same_kl);
  CHECK(same_resets);
  CHECK(a.rollout.scheduler().state() == b.rollout.scheduler().state());
  CHECK(a.engine.policy_version() == b.engine.policy_version());
  CHECK(a.loop.steps_done() == b.loop.steps_done());
}

struct temp_dir {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("rlvr_checkpoint_test_" + std::to_string(static_cast<long long>(::getpid())));
  temp_dir() { std::filesystem::create_directories(path); }
  ~temp_dir() { std::filesystem::remove_all(path); }
  [[nodiscard]] std::string operator/(const std::string& name) const { return (path / name).string(); }
};

std::vector<char> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void write_all(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

//! load_checkpoint(path) throws checkpoint_error whose message contains `what`.
void check_refused(run& r, const std::string& path, const std::string& what) {
  INFO("loading " << path);
  try {
    r.loop.load_checkpoint(path);
    FAIL("the checkpoint loaded");
  } catch (const rlvr::checkpoint_error& e) {
    INFO("message: " << e.what());
    CHECK(std::string(e.what()).find(what) != std::string::npos);
  }
}

constexpr int K = 3, M = 4;

}  // namespace

TEST_CASE("checkpoint: K steps, save, rebuild, load, M steps equals K + M steps bit for bit",
          "[trainer][checkpoint]") {
  torch::set_num_threads(1);
  const auto is = GENERATE(rlvr::old_policy::pois, rlvr::old_policy::sais);
  INFO((is == rlvr::old_policy::pois ? "POIS" : "SAIS"));
  const temp_dir dir;
  const auto file = dir / "run.ckpt";

  run straight({.is = is});
  std::vector<std::vector<double>> expected;
  double best_reward = 0;
  for (int s = 0; s < K + M; ++s) {
    const auto r = straight.loop.step();
    best_reward = std::max(best_reward, r.train.reward_mean);
    expected.push_back(numbers(r));
  }
  CHECK(best_reward > 0);  // some groups carry a policy-gradient signal

  std::vector<std::vector<double>> got;
  {
    run first({.is = is});
    for (int s = 0; s < K; ++s) got.push_back(numbers(first.loop.step()));
    // What the save has to carry: partial responses, a moved KL coefficient, a reset reference,
    // the learning-rate ramp part way.
    CHECK(paused_with_tokens(first.rollout.scheduler()) > 0);
    CHECK(first.trainer.kl_controller().state().updates == static_cast<std::uint64_t>(K));
    CHECK(first.trainer.kl_controller().value() != first.trainer.kl_controller().config().init_coef);
    CHECK(first.trainer.reset_policy().state().resets >= 1);
    CHECK(first.trainer.optimizer_steps() > 0);
    first.loop.save_checkpoint(file);
    first.loop.save_checkpoint(file);  // replacing a checkpoint leaves no temporary behind
  }
  for (const auto& e : std::filesystem::directory_iterator(dir.path))
    CHECK(e.path().filename().string() == "run.ckpt");

  run resumed({.init_seed = 99, .warm = false, .is = is});
  resumed.loop.load_checkpoint(file);
  CHECK(resumed.loop.steps_done() == K);
  for (int s = 0; s < M; ++s) got.push_back(numbers(resumed.loop.step()));

  REQUIRE(got.size() == expected.size());
  for (std::size_t s = 0; s < got.size(); ++s) {
    INFO("step " << s + 1);
    REQUIRE(got[s].size() == expected[s].size());
    for (std::size_t i = 0; i < got[s].size(); ++i) {
      INFO("number " << i << ": " << got[s][i] << " vs " << expected[s][i]);
      CHECK(got[s][i] == expected[s][i]);
    }
  }
  check_same_state(straight, resumed);
  // The resumed part exercised the restored controllers: a reset after the save, beta still moving.
  CHECK(resumed.trainer.reset_policy().state().resets > 1);
  CHECK(resumed.trainer.kl_controller().state().updates == static_cast<std::uint64_t>(K + M));
}

TEST_CASE("checkpoint: truncated, corrupted, foreign and mismatched checkpoints are refused",
          "[trainer][checkpoint][errors]") {
  torch::set_num_threads(1);
  const temp_dir dir;
  const auto file = dir / "run.ckpt";
  {
    run r({});
    for (int s = 0; s < 2; ++s) (void)r.loop.step();
    r.loop.save_checkpoint(file);
  }
  const auto bytes = read_all(file);
  REQUIRE(bytes.size() > 1000);

  run target({});
  const auto weights = rlvr::snapshot_parameters(target.policy);
  const auto scheduler = target.rollout.scheduler().state();

  SECTION("truncated") {
    for (const std::size_t keep : {std::size_t{0}, std::size_t{10}, bytes.size() / 2, bytes.size() - 1}) {
      const auto cut = dir / ("cut" + std::to_string(keep));
      write_all(cut, std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(keep)));
      check_refused(target, cut, "truncated");
    }
  }
  SECTION("corrupted") {
    auto bad = bytes;
    bad[bad.size() / 2] = static_cast<char>(bad[bad.size() / 2] ^ 0x10);
    write_all(dir / "bad", bad);
    check_refused(target, dir / "bad", "checksum");
    auto longer = bytes;
    longer.push_back('x');
    write_all(dir / "longer", longer);
    check_refused(target, dir / "longer", "after the checkpoint's end");
  }
  SECTION("foreign: a warm-up weights file, and no file") {
    torch::save(target.policy, dir / "warm.pt");
    check_refused(target, dir / "warm.pt", "not an rlvr_train training checkpoint");
    check_refused(target, dir / "missing", "cannot open");
  }
  SECTION("another model size") {
    run wider({.warm = false, .d_model = 64});
    const auto wide = rlvr::snapshot_parameters(wider.policy);
    check_refused(wider, file, "policy d_model is 32 in the checkpoint, 64 here");
    check_same_tensors(rlvr::snapshot_parameters(wider.policy), wide);
    CHECK(wider.loop.steps_done() == 0);
  }
  SECTION("another configuration") {
    run other({.lr = 2e-3});
    check_refused(other, file, "trainer lr is 0.001");
    CHECK(other.rollout.scheduler().state() == scheduler);
  }
  // A refused load leaves the loop as it was.
  check_same_tensors(rlvr::snapshot_parameters(target.policy), weights);
  CHECK(target.rollout.scheduler().state() == scheduler);
  CHECK(target.loop.steps_done() == 0);
  CHECK(target.engine.policy_version() == 0);
}
