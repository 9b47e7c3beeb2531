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
#include <vector>

#include "plot.hpp"

namespace {

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "%s\nusage: rlvr_plot --out FILE.svg [--x COLUMN] [--markers COLUMN] [--columns N]\n"
               "                 --panel COLUMN[=TITLE] [--panel ...] RUN.csv[=LABEL] ...\n",
               why.c_str());
  std::exit(2);
}

std::pair<std::string, std::string> split_eq(const std::string& s) {
  const auto k = s.find('=');
  return k == std::string::npos ? std::pair{s, s} : std::pair{s.substr(0, k), s.substr(k + 1)};
}

}  // namespace

int main(int argc, char** argv) {
  std::string out, x = "step", markers;
  int columns = 2;
  std::vector<rlvr::plot::panel_spec> specs;
  std::vector<std::pair<std::string, std::string>> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") usage("rlvr_plot: overlay rlvr_train CSVs as an SVG figure");
    if (a.rfind("--", 0) == 0) {
      if (i + 1 >= argc) usage("missing value for " + a);
      const std::string v = argv[++i];
      if (a == "--out") out = v;
      else if (a == "--x") x = v;
      else if (a == "--markers") markers = v;
      else if (a == "--columns") columns = std::atoi(v.c_str());
      else if (a == "--panel") {
        const auto [column, title] = split_eq(v);
        specs.push_back({.column = column, .title = title, .y_label = column});
      } else usage("unknown option " + a);
    } else {
      auto [path, label] = split_eq(a);
      if (path == label) {
        const auto slash = path.find_last_of('/');
        label = slash == std::string::npos ? path : path.substr(slash + 1);
      }
      files.emplace_back(path, label);
    }
  }
  if (out.empty() || specs.empty() || files.empty()) usage("--out, at least one --panel and one CSV are required");
  if (columns < 1) usage("--columns must be >= 1");
  try {
    std::vector<rlvr::plot::named_run> runs;
    for (const auto& [path, label] : files) runs.push_back({.label = label, .table = rlvr::plot::csv_table::read(path)});
    rlvr::plot::write_svg(out, rlvr::plot::panels_of(runs, specs, x, markers), columns);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rlvr_plot: %s\n", e.what());
    return 1;
  }
  std::printf("wrote %s (%zu panels, %zu runs)\n", out.c_str(), specs.size(), files.size());
  return 0;
}
