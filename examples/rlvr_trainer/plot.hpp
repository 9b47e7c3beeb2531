// plot.hpp — line charts as a self-contained SVG document, for the trainer's curves (rlvr_train
// --svg) and for overlaying several runs (rlvr_plot). No dependency beyond the standard library.
//
// A figure is a grid of panels; a panel holds lines (x, y points; a point with a non-finite value is
// left out and the line joins its neighbours, so a column recorded every k steps is one line), optional
// vertical markers (the training steps at which the reference was reset) and its axis labels. Axis
// ranges cover every finite point; ticks are 1, 2 or 5 times a power of ten.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <ulorl/core/checkpoint_file.hpp>

namespace rlvr::plot {

struct series {
  std::string label{};
  std::vector<double> x{}, y{};  //!< same length; a point with a non-finite value is left out
};

struct panel {
  std::string title{}, x_label{}, y_label{};
  std::vector<series> lines{};
  std::vector<double> markers{};  //!< x positions of dashed vertical lines (e.g. reference resets)
  std::string marker_label{};     //!< legend entry of the markers
};

namespace detail {

inline std::string escape(const std::string& s) {
  std::string o;
  for (const char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

inline std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

inline std::string tick_text(double v, double step) {
  char b[32];
  if (std::abs(v) < step * 1e-9) v = 0;
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  std::snprintf(b, sizeof b, "%.*f", decimals, v);
  return b;
}

//! A tick step of 1, 2 or 5 x 10^k giving about `target` intervals over [lo, hi].
inline double nice_step(double lo, double hi, int target = 5) {
  const double raw = (hi - lo) / target;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * p) return m * p;
  return 10 * p;
}

struct range {
  double lo = INFINITY, hi = -INFINITY;
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  //! Widened to whole ticks; a degenerate or empty range becomes a unit interval.
  [[nodiscard]] range padded(double& step) const {
    range r = *this;
    if (!(r.lo <= r.hi)) r = {0, 1};
    if (r.hi - r.lo < 1e-12 * std::max(1.0, std::abs(r.hi))) {
      r.lo -= 0.5 * std::max(1.0, std::abs(r.lo));
      r.hi += 0.5 * std::max(1.0, std::abs(r.hi));
    }
    step = nice_step(r.lo, r.hi);
    r.lo = std::floor(r.lo / step + 1e-9) * step;
    r.hi = std::ceil(r.hi / step - 1e-9) * step;
    return r;
  }
};

inline const char* colour(std::size_t i) {
  static const char* const c[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f"};
  return c[i % (sizeof c / sizeof c[0])];
}

inline void draw_panel(std::ostringstream& o, const panel& p, double ox, double oy, double w, double h) {
  const double left = 62, right = 12, top = 28, bottom = 44;
  const double pw = w - left - right, ph = h - top - bottom;
  range xr, yr;
  for (const auto& s : p.lines) {
    if (s.x.size() != s.y.size()) throw std::invalid_argument("plot: series '" + s.label + "' has x and y of different lengths");
    for (std::size_t i = 0; i < s.x.size(); ++i)
      if (std::isfinite(s.y[i])) {
        xr.add(s.x[i]);
        yr.add(s.y[i]);
      }
  }
  for (const double m : p.markers) xr.add(m);
  double xs = 1, ys = 1;
  const range X = xr.padded(xs), Y = yr.padded(ys);
  const auto px = [&](double x) { return ox + left + (x - X.lo) / (X.hi - X.lo) * pw; };
  const auto py = [&](double y) { return oy + top + ph - (y - Y.lo) / (Y.hi - Y.lo) * ph; };
  o << "<text x=\"" << num(ox + left + pw / 2) << "\" y=\"" << num(oy + 18)
    << "\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">" << escape(p.title) << "</text>\n";
  o << "<rect x=\"" << num(ox + left) << "\" y=\"" << num(oy + top) << "\" width=\"" << num(pw) << "\" height=\""
    << num(ph) << "\" fill=\"none\" stroke=\"#444\"/>\n";
  for (double t = X.lo; t <= X.hi + xs * 1e-9; t += xs) {
    o << "<line x1=\"" << num(px(t)) << "\" y1=\"" << num(oy + top) << "\" x2=\"" << num(px(t)) << "\" y2=\""
      << num(oy + top + ph) << "\" stroke=\"#e4e4e4\"/>\n";
    o << "<text x=\"" << num(px(t)) << "\" y=\"" << num(oy + top + ph + 15) << "\" text-anchor=\"middle\" font-size=\"11\">"
      << tick_text(t, xs) << "</text>\n";
  }
  for (double t = Y.lo; t <= Y.hi + ys * 1e-9; t += ys) {
    o << "<line x1=\"" << num(ox + left) << "\" y1=\"" << num(py(t)) << "\" x2=\"" << num(ox + left + pw) << "\" y2=\""
      << num(py(t)) << "\" stroke=\"#e4e4e4\"/>\n";
    o << "<text x=\"" << num(ox + left - 5) << "\" y=\"" << num(py(t) + 4) << "\" text-anchor=\"end\" font-size=\"11\">"
      << tick_text(t, ys) << "</text>\n";
  }
  o << "<text x=\"" << num(ox + left + pw / 2) << "\" y=\"" << num(oy + h - 8) << "\" text-anchor=\"middle\" font-size=\"12\">"
    << escape(p.x_label) << "</text>\n";
  o << "<text transform=\"translate(" << num(ox + 14) << "," << num(oy + top + ph / 2)
    << ") rotate(-90)\" text-anchor=\"middle\" font-size=\"12\">" << escape(p.y_label) << "</text>\n";
  for (const double m : p.markers)
    o << "<line x1=\"" << num(px(m)) << "\" y1=\"" << num(oy + top) << "\" x2=\"" << num(px(m)) << "\" y2=\""
      << num(oy + top + ph) << "\" stroke=\"#888\" stroke-dasharray=\"4,3\"/>\n";
  double ly = oy + top + 14;
  for (std::size_t k = 0; k < p.lines.size(); ++k) {
    const auto& s = p.lines[k];
    std::string path;
    bool pen = false;
    std::size_t points = 0;
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.y[i]) || !std::isfinite(s.x[i])) continue;
      path += (pen ? " L" : " M") + num(px(s.x[i])) + "," + num(py(s.y[i]));
      pen = true;
      ++points;
    }
    if (!path.empty())
      o << "<path d=\"" << path << "\" fill=\"none\" stroke=\"" << colour(k) << "\" stroke-width=\"1.6\"/>\n";
    if (points <= 40)
      for (std::size_t i = 0; i < s.x.size(); ++i)
        if (std::isfinite(s.y[i]) && std::isfinite(s.x[i]))
          o << "<circle cx=\"" << num(px(s.x[i])) << "\" cy=\"" << num(py(s.y[i])) << "\" r=\"2.2\" fill=\"" << colour(k)
            << "\"/>\n";
    if (!s.label.empty()) {
      o << "<line x1=\"" << num(ox + left + 8) << "\" y1=\"" << num(ly - 4) << "\" x2=\"" << num(ox + left + 26) << "\" y2=\""
        << num(ly - 4) << "\" stroke=\"" << colour(k) << "\" stroke-width=\"2\"/>\n";
      o << "<text x=\"" << num(ox + left + 30) << "\" y=\"" << num(ly) << "\" font-size=\"11\">" << escape(s.label) << "</text>\n";
      ly += 14;
    }
  }
  if (!p.markers.empty() && !p.marker_label.empty()) {
    o << "<line x1=\"" << num(ox + left + 8) << "\" y1=\"" << num(ly - 4) << "\" x2=\"" << num(ox + left + 26) << "\" y2=\""
      << num(ly - 4) << "\" stroke=\"#888\" stroke-dasharray=\"4,3\"/>\n";
    o << "<text x=\"" << num(ox + left + 30) << "\" y=\"" << num(ly) << "\" font-size=\"11\">" << escape(p.marker_label)
      << "</text>\n";
  }
}

}  // namespace detail

//! The SVG document of `panels` in a grid of `columns` (each panel width x height pixels).
[[nodiscard]] inline std::string svg(const std::vector<panel>& panels, int columns = 2, double width = 460,
                                     double height = 300) {
  if (columns < 1) throw std::invalid_argument("plot::svg: columns must be >= 1");
  const auto n = static_cast<int>(panels.size());
  const int cols = std::max(1, std::min(columns, n));
  const int rows = (n + cols - 1) / cols;
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << detail::num(cols * width) << "\" height=\""
    << detail::num(std::max(1, rows) * height) << "\" font-family=\"sans-serif\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (int i = 0; i < n; ++i)
    detail::draw_panel(o, panels[static_cast<std::size_t>(i)], (i % cols) * width, (i / cols) * height, width, height);
  o << "</svg>\n";
  return o.str();
}

inline void write_svg(const std::string& path, const std::vector<panel>& panels, int columns = 2) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("plot: cannot write " + path);
  f << svg(panels, columns);
  f.close();  // the last bytes reach the file (or fail, e.g. on a full device) here
  if (!f) throw std::runtime_error("plot: write failed: " + path);
}

//! A CSV file with a header row: columns by name, an empty or unparsable field is NaN.
struct csv_table {
  std::vector<std::string> names{};
  std::vector<std::vector<double>> columns{};

  [[nodiscard]] const std::vector<double>& column(const std::string& name) const {
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return columns[i];
    throw std::invalid_argument("plot: no column '" + name + "'");
  }

  //! Appends one row (one value per column, NaN for none).
  void append(const std::vector<double>& row) {
    if (row.size() != names.size()) throw std::invalid_argument("plot: a row of " + std::to_string(row.size()) +
                                                                " values for " + std::to_string(names.size()) + " columns");
    if (columns.size() != names.size()) columns.resize(names.size());
    for (std::size_t i = 0; i < row.size(); ++i) columns[i].push_back(row[i]);
  }

  //! Writes the header and the rows; NaN is written as an empty field.
  void write(const std::string& path) const {
    std::ofstream f(path);
    if (!f) throw std::runtime_error("plot: cannot write " + path);
    for (std::size_t i = 0; i < names.size(); ++i) f << (i ? "," : "") << names[i];
    f << '\n';
    const std::size_t rows = columns.empty() ? 0 : columns[0].size();
    char b[40];
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t i = 0; i < names.size(); ++i) {
        if (i) f << ',';
        if (std::isfinite(columns[i][r])) {
          std::snprintf(b, sizeof b, "%.9g", columns[i][r]);
          f << b;
        }
      }
      f << '\n';
    }
    f.close();
    if (!f) throw std::runtime_error("plot: write failed: " + path);
  }

  //! Reads `path` through ulorl's bounded reader: a regular file only (a FIFO is refused, never
  //! waited for), at most 1 GiB.
  [[nodiscard]] static csv_table read(const std::string& path) {
    const auto bytes = ulorl::detail::read_file(path, "read_file");
    std::istringstream f(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    csv_table t;
    std::string line;
    const auto split = [](const std::string& s) {
      std::vector<std::string> out(1);
      for (const char c : s) {
        if (c == ',') out.emplace_back();
        else if (c != '\r') out.back() += c;
      }
      return out;
    };
    if (!std::getline(f, line)) throw std::runtime_error("plot: " + path + " is empty");
    t.names = split(line);
    t.columns.resize(t.names.size());
    while (std::getline(f, line)) {
      if (line.empty()) continue;
      const auto fields = split(line);
      for (std::size_t i = 0; i < t.names.size(); ++i) {
        double v = NAN;
        if (i < fields.size() && !fields[i].empty()) {
          char* end = nullptr;
          v = std::strtod(fields[i].c_str(), &end);
          if (end == fields[i].c_str()) v = NAN;
        }
        t.columns[i].push_back(v);
      }
    }
    return t;
  }
};

//! One panel per (column, title, y label): that column of every run against `x_column`, labelled by
//! the run's name; rows of `marker_column` > 0 in any run become markers.
struct panel_spec {
  std::string column{}, title{}, y_label{};
};

struct named_run {
  std::string label{};
  csv_table table{};
};

[[nodiscard]] inline std::vector<panel> panels_of(const std::vector<named_run>& runs, const std::vector<panel_spec>& specs,
                                                  const std::string& x_column = "step",
                                                  const std::string& marker_column = "") {
  std::vector<panel> out;
  for (const auto& s : specs) {
    panel p{.title = s.title, .x_label = x_column, .y_label = s.y_label};
    for (const auto& r : runs) p.lines.push_back({.label = r.label, .x = r.table.column(x_column), .y = r.table.column(s.column)});
    if (!marker_column.empty()) {
      for (const auto& r : runs) {
        const auto& m = r.table.column(marker_column);
        const auto& x = r.table.column(x_column);
        for (std::size_t i = 0; i < m.size(); ++i)
          if (m[i] > 0) p.markers.push_back(x[i]);
      }
      p.marker_label = "reference reset";
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace rlvr::plot
