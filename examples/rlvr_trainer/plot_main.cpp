// rlvr_plot — overlays the per-step CSVs of several rlvr_train runs as one SVG figure (plot.hpp).
//
//   rlvr_plot --out FILE.svg [--x COLUMN] [--markers COLUMN] [--columns N]
//             --panel COLUMN[=TITLE] [--panel ...] RUN.csv[=LABEL] [RUN.csv[=LABEL] ...]
//
// Each --panel draws COLUMN of every run against --x (default: step); a run's label defaults to its
// file name. --markers COLUMN draws a dashed line wherever that column is > 0 (rlvr_train's `reset`).
//
//   rlvr_plot --out entropy.svg --panel entropy=Entropy --panel validation_accuracy=Validation
//             off.csv=off static.csv=static dynamic.csv=dynamic
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../common/args.hpp"
#include "plot.hpp"

namespace {

[[noreturn]] void usage(const std::string& why) {
  std::printf("%s\nusage: rlvr_plot --out FILE.svg [--x COLUMN] [--markers COLUMN] [--columns N]\n"
              "                 --panel COLUMN[=TITLE] [--panel ...] RUN.csv[=LABEL] ...\n",
              why.c_str());
  std::fflush(stdout);
  std::exit(std::ferror(stdout) ? cli::failure_status : 0);
}

std::pair<std::string, std::string> split_eq(const std::string& s) {
  const auto k = s.find('=');
  return k == std::string::npos ? std::pair{s, s} : std::pair{s.substr(0, k), s.substr(k + 1)};
}

int run(int argc, char** argv) {
  std::string out, x = "step", markers;
  int columns = 2;
  std::vector<rlvr::plot::panel_spec> specs;
  std::vector<std::pair<std::string, std::string>> files;
  cli::reader args(argc, argv);
  while (args.next()) {
    const std::string_view a = args.flag();
    if (a == "--help" || a == "-h") usage("rlvr_plot: overlay rlvr_train CSVs as an SVG figure");
    if (a.substr(0, 2) == "--") {
      if (a == "--out") out = cli::output_path(a, args.value());
      else if (a == "--x") x = args.value();
      else if (a == "--markers") markers = args.value();
      else if (a == "--columns") columns = cli::integer(a, args.value(), 1, 64);
      else if (a == "--panel") {
        const auto [column, title] = split_eq(std::string(args.value()));
        specs.push_back({.column = column, .title = title, .y_label = column});
      } else args.unknown();
    } else {
      auto [path, label] = split_eq(std::string(a));
      if (path == label) {
        const auto slash = path.find_last_of('/');
        label = slash == std::string::npos ? path : path.substr(slash + 1);
      }
      files.emplace_back(cli::path("RUN.csv", path), label);
    }
  }
  if (out.empty()) cli::fail("--out", "is required");
  if (specs.empty()) cli::fail("--panel", "at least one is required");
  if (files.empty()) cli::fail("RUN.csv", "at least one CSV is required");
  std::vector<rlvr::plot::named_run> runs;
  for (const auto& [path, label] : files) {
    cli::require_regular_file("RUN.csv", path);  // never blocks on a FIFO
    runs.push_back({.label = label, .table = rlvr::plot::csv_table::read(path)});
  }
  rlvr::plot::write_svg(out, rlvr::plot::panels_of(runs, specs, x, markers), columns);
  std::printf("wrote %s (%zu panels, %zu runs)\n", out.c_str(), specs.size(), files.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A usage error exits 2; an unreadable CSV or an unwritable --out prints one line naming it and exits 1.
  return cli::run("rlvr_plot", [&] { return run(argc, argv); });
}
