// The trainer's plots and CSV records (examples/rlvr_trainer/plot.hpp): tick steps, the CSV round
// trip with missing values, and the SVG elements a figure must contain. Plain C++ (no torch).
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "catch.hpp"
#include "plot.hpp"

namespace plot = rlvr::plot;

namespace {
std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto k = s.find(what); k != std::string::npos; k = s.find(what, k + what.size())) ++n;
  return n;
}
}  // namespace

TEST_CASE("tick steps are 1, 2 or 5 times a power of ten", "[trainer][plot]") {
  CHECK(plot::detail::nice_step(0, 1) == Approx(0.2));
  CHECK(plot::detail::nice_step(0, 10) == Approx(2));
  CHECK(plot::detail::nice_step(0, 0.37) == Approx(0.1));
  CHECK(plot::detail::nice_step(0, 120) == Approx(50));
  CHECK(plot::detail::nice_step(3, 3.06) == Approx(0.02));
}

TEST_CASE("a CSV record round-trips, missing values stay missing", "[trainer][plot]") {
  plot::csv_table t{.names = {"step", "validation_accuracy", "kl"}};
  t.append({1, NAN, 0.001234567891});
  t.append({2, 0.25, 1e-9});
  CHECK_THROWS_AS(t.append({3, 0.5}), std::invalid_argument);
  const auto path = (std::filesystem::temp_directory_path() / "ulorl_test_plot.csv").string();
  t.write(path);
  const auto r = plot::csv_table::read(path);
  std::filesystem::remove(path);
  REQUIRE(r.names == t.names);
  REQUIRE(r.column("step").size() == 2);
  CHECK(std::isnan(r.column("validation_accuracy")[0]));
  CHECK(r.column("validation_accuracy")[1] == 0.25);
  CHECK(r.column("kl")[0] == Approx(0.001234567891).epsilon(1e-8));
  CHECK(r.column("kl")[1] == 1e-9);
  CHECK_THROWS_AS(r.column("reward"), std::invalid_argument);
  CHECK_THROWS_AS(plot::csv_table::read(path), ulorl::error);  // removed above
  // A FIFO is refused, never opened for a blocking read.
  const auto fifo = (std::filesystem::temp_directory_path() / "ulorl_test_plot.fifo").string();
  std::filesystem::remove(fifo);
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_AS(plot::csv_table::read(fifo), ulorl::error);
  std::filesystem::remove(fifo);
}

TEST_CASE("an SVG figure has every panel, line, marker and legend entry; missing points are left out", "[trainer][plot]") {
  plot::panel a{.title = "KL <per token>", .x_label = "step", .y_label = "nats"};
  a.lines.push_back({.label = "on", .x = {1, 2, 3, 4}, .y = {0.1, NAN, 0.3, 0.2}});
  a.lines.push_back({.label = "off", .x = {1, 2, 3, 4}, .y = {0.2, 0.2, 0.2, 0.2}});
  a.markers = {2.5};
  a.marker_label = "reference reset";
  plot::panel b{.title = "empty", .x_label = "step", .y_label = "y"};
  const auto s = plot::svg({a, b}, 2);
  CHECK(s.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(s.find("</svg>") != std::string::npos);
  CHECK(s.find("KL &lt;per token&gt;") != std::string::npos);  // escaped
  CHECK(s.find(">empty<") != std::string::npos);
  CHECK(count(s, "<path ") == 2);
  CHECK(count(s, " M") == 2);  // one move per line: the missing point is left out, not a gap
  CHECK(count(s, " L") == 2 + 3);
  CHECK(count(s, "<circle ") == 3 + 4);
  CHECK(count(s, "stroke-dasharray") == 2);  // the marker and its legend entry
  CHECK(s.find(">reference reset<") != std::string::npos);
  CHECK(s.find(">on<") != std::string::npos);
  CHECK(s.find(">off<") != std::string::npos);
  plot::panel bad{.title = "bad"};
  bad.lines.push_back({.label = "x", .x = {1, 2}, .y = {1}});
  CHECK_THROWS_AS(plot::svg({bad}), std::invalid_argument);
}

TEST_CASE("panels_of overlays one column of every run and collects the resets", "[trainer][plot]") {
  plot::csv_table r1{.names = {"step", "entropy", "reset"}}, r2{.names = {"step", "entropy", "reset"}};
  r1.append({1, 0.9, 0});
  r1.append({2, 0.8, 1});
  r2.append({1, 0.7, 0});
  const auto p = plot::panels_of({{"dynamic", r1}, {"off", r2}}, {{.column = "entropy", .title = "Entropy", .y_label = "nats"}},
                                 "step", "reset");
  REQUIRE(p.size() == 1);
  REQUIRE(p[0].lines.size() == 2);
  CHECK(p[0].lines[0].label == "dynamic");
  CHECK(p[0].lines[1].y == std::vector<double>{0.7});
  CHECK(p[0].markers == std::vector<double>{2});
}
