// advantage_table — computes the advantages of a sample RLVR batch with ulorl and prints them as a
// table: 4 prompts x 4 responses from a verifier (0/1 rewards), one response truncated at L_max,
// UloRL's "truncated is incorrect" rule, DAPO's soft overlong penalty, DAPO's dynamic-sampling
// filter, and GRPO advantages under three framework presets side by side.
#include <ulorl/ulorl.hpp>

#include <cstdio>
#include <vector>

#include "common/args.hpp"

namespace {

int run() {
  constexpr std::size_t group_size = 4;
  // prompt id per response (unsorted on purpose: a trainer's batch after shuffling)
  const std::vector<std::int64_t> prompt{0, 1, 0, 2, 1, 3, 0, 2, 1, 3, 2, 0, 3, 1, 2, 3};
  std::vector<double> reward{1, 0, 0, 1, 1, 1, 1, 1, 0, 1, 0, 1, 1, 1, 1, 1};
  const std::vector<double> length{812, 4096, 1900, 3100, 2250, 640, 3990, 2890, 4096, 700, 3500, 3700, 810, 1500, 3050, 920};
  const std::vector<int> truncated{0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0};
  const double max_length = 4096;

  // UloRL: a response that hit L_max without EOS is incorrect, whatever the verifier said.
  const std::size_t n_trunc = ulorl::truncated_as_incorrect(std::span<double>(reward), std::span<const int>(truncated));
  // DAPO: soft penalty in the last 512 tokens before L_max.
  std::vector<double> penalty(reward.size()), shaped(reward.size());
  ulorl::dapo_overlong_penalties(std::span<const double>(length), std::span<double>(penalty),
                                 {.max_length = max_length, .buffer_length = 512, .penalty_factor = 1.0});
  for (std::size_t i = 0; i < reward.size(); ++i) shaped[i] = reward[i] + penalty[i];

  const auto groups = ulorl::group_layout::from_ids(std::span<const std::int64_t>(prompt));
  std::vector<int> keep(reward.size());
  const auto filter = ulorl::dynamic_sampling_filter(std::span<const double>(reward), groups, std::span<int>(keep));

  std::vector<double> verl(reward.size()), nemo(reward.size()), drgrpo(reward.size());
  ulorl::group_advantages(std::span<const double>(shaped), groups, std::span<double>(verl), ulorl::presets::verl::grpo_advantage().group);
  ulorl::group_advantages(std::span<const double>(shaped), groups, std::span<double>(nemo), ulorl::presets::nemo_rl::advantage().group);
  ulorl::group_advantages(std::span<const double>(shaped), groups, std::span<double>(drgrpo),
                          ulorl::presets::verl::grpo_advantage({.norm_adv_by_std_in_grpo = false}).group);

  std::printf("ulorl %d.%d.%d — advantages of a sample RLVR batch (%zu prompts x %zu responses)\n\n",
              ULORL_VERSION_MAJOR, ULORL_VERSION_MINOR, ULORL_VERSION_PATCH, groups.count(), group_size);
  std::printf("%4s %6s %6s %5s %6s %8s %7s %4s %10s %10s %10s\n", "resp", "prompt", "length", "trunc", "reward",
              "overlong", "shaped", "keep", "verl GRPO", "NeMo RLOO", "Dr. GRPO");
  for (std::size_t g = 0; g < groups.count(); ++g)
    for (auto i : groups.members(g))
      std::printf("%4u %6lld %6.0f %5s %6.0f %8.3f %7.3f %4s %10.4f %10.4f %10.4f\n", i,
                  static_cast<long long>(prompt[i]), length[i], truncated[i] ? "yes" : "", reward[i], penalty[i],
                  shaped[i], keep[i] ? "yes" : "no", verl[i], nemo[i], drgrpo[i]);
  std::printf("\n%zu truncated response(s) scored incorrect; dynamic sampling keeps %zu of %zu groups "
              "(%zu with zero reward variance dropped)\n",
              n_trunc, filter.kept_groups, filter.groups, filter.zero_variance_groups);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // No options: any argument is a usage error (exit status 2); the table's output is checked.
  return cli::run("advantage_table", [&] {
    cli::reader args(argc, argv);
    if (args.next()) {
      if (args.flag() != "--help" && args.flag() != "-h") args.unknown();
      std::printf("usage: advantage_table (no options): prints the advantages of a sample RLVR batch\n");
      return 0;
    }
    return run();
  });
}
