// Writes generated seed inputs for a fuzz target into a directory: `fuzz_seed_gen TARGET DIR`.
// For the checkpoint readers these are real checkpoints saved mid-run (idle and with a step open,
// over varied configurations), prefixed with the target's mode byte; for the other targets, a few
// deterministic pseudo-random inputs. Deterministic: the same files every run.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.hpp"
#include "scheduler_fuzz.hpp"
#include "ulorl/control.hpp"
#include "ulorl/rollout.hpp"

namespace {

void write(const std::string& dir, const std::string& name, std::uint8_t mode, const std::vector<std::byte>& body) {
  std::ofstream f(dir + "/" + name, std::ios::binary);
  f.put(static_cast<char>(mode));
  f.write(reinterpret_cast<const char*>(body.data()), static_cast<std::streamsize>(body.size()));
}

std::vector<std::byte> random_bytes(std::mt19937_64& rng, std::size_t n) {
  std::vector<std::byte> b(n);
  for (auto& x : b) x = static_cast<std::byte>(rng() & 0xffu);
  return b;
}

void scheduler_seeds(const std::string& dir) {
  std::mt19937_64 rng(20260729);
  int written = 0;
  for (int i = 0; i < 24; ++i) {
    const auto drive = random_bytes(rng, 512);
    FuzzedDataProvider p(reinterpret_cast<const std::uint8_t*>(drive.data()), drive.size());
    ulorl::segment_scheduler s(fuzz::scheduler_config(p));
    fuzz::drive_valid(s, p, 2 + i % 9, i % 2 == 1);
    const auto ckpt = ulorl::save_scheduler(s);
    write(dir, "gen-ckpt-raw-" + std::to_string(i), 0, ckpt);
    write(dir, "gen-ckpt-fixed-" + std::to_string(i), 1, ckpt);
    write(dir, "gen-structured-" + std::to_string(i), 2, drive);
    write(dir, "gen-near-limits-" + std::to_string(i), 3, drive);
    written += 4;
    if (i % 4 == 0) {  // the same checkpoints read through a file (mode + 5)
      write(dir, "gen-ckpt-raw-file-" + std::to_string(i), 5, ckpt);
      write(dir, "gen-ckpt-fixed-file-" + std::to_string(i), 6, ckpt);
      written += 2;
    }
  }
  for (int i = 0; i < 8; ++i) {
    write(dir, "gen-tuner-" + std::to_string(i), 4, random_bytes(rng, 256));
    ++written;
  }
  std::printf("fuzz_seed_gen: %d scheduler seeds\n", written);
}

void controller_seeds(const std::string& dir) {
  std::mt19937_64 rng(7);
  // Raw seeds are exact checkpoints (mode byte = kind); structured seeds (mode byte 3 + kind) are
  // random field values.
  ulorl::kl_controller k({.type = ulorl::kl_control_type::adaptive, .init_coef = 0.05, .target_kl = 0.1});
  for (int i = 0; i < 5; ++i) (void)k.update(0.02 * i, 256);
  write(dir, "gen-kl-raw", 0, k.save());
  write(dir, "gen-kl-default-raw", 0, ulorl::kl_controller{}.save());
  ulorl::entropy_controller e({.rule = ulorl::entropy_control_rule::proportional, .init_coef = 0.01});
  for (int i = 0; i < 5; ++i) (void)e.update(0.1 * i);
  write(dir, "gen-entropy-raw", 1, e.save());
  write(dir, "gen-entropy-step-raw", 1, ulorl::entropy_controller{}.save());
  ulorl::reference_reset_policy r({.every_n_steps = 3, .on_drop = true, .on_kl_share = true, .cooldown_steps = 1});
  for (int i = 0; i < 7; ++i) {
    (void)r.observe_step(i, 0.1 * i, 1.0);
    (void)r.observe_validation(i, 0.5 - 0.01 * i);
  }
  write(dir, "gen-reset-raw", 2, r.save());
  for (int kind = 0; kind < 3; ++kind) write(dir, "gen-structured-" + std::to_string(kind), static_cast<std::uint8_t>(3 + kind), random_bytes(rng, 160));
  // The same, read through a file (mode byte + 6).
  write(dir, "gen-kl-raw-file", 6, k.save());
  write(dir, "gen-entropy-raw-file", 7, e.save());
  write(dir, "gen-reset-raw-file", 8, r.save());
  for (int kind = 0; kind < 3; ++kind)
    write(dir, "gen-structured-file-" + std::to_string(kind), static_cast<std::uint8_t>(9 + kind), random_bytes(rng, 160));
  std::printf("fuzz_seed_gen: 14 controller seeds\n");
}

void random_seeds(const std::string& dir, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 8; ++i) {
    const auto b = random_bytes(rng, 64 + 64 * static_cast<std::size_t>(i));
    write(dir, "gen-random-" + std::to_string(i), static_cast<std::uint8_t>(i), b);
  }
  std::printf("fuzz_seed_gen: 8 random seeds\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: fuzz_seed_gen TARGET DIR\n");
    return 2;
  }
  const std::string_view target = argv[1];
  const std::string dir = argv[2];
  if (target == "fuzz_scheduler_restore") scheduler_seeds(dir);
  else if (target == "fuzz_controller_restore") controller_seeds(dir);
  else if (target == "fuzz_conformance") std::printf("fuzz_seed_gen: the golden cases are the seeds\n");
  else random_seeds(dir, std::hash<std::string_view>{}(target));
  return 0;
}
