// ulorl-conformance: runs the golden cases of ../shared/golden (format: its README).
//   ulorl-conformance run CASE.json   prints {"outputs": {...}} or {"error": "..."}
//   ulorl-conformance check DIR       runs every *.json in DIR, prints "N passed, M failed"
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <ulorl/core/error.hpp>

#include "conformance/registry.hpp"

namespace conformance {

std::map<std::string, handler>& registry() {
  static std::map<std::string, handler> r;
  return r;
}

double to_double(const json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const auto s = v.get<std::string>();
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
  }
  if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
  throw reject("expected a number, got " + v.dump());
}

matrix to_matrix(const json& v, const char* name) {
  if (!v.is_array()) throw reject(std::string("input '") + name + "' must be a [B][T] list");
  matrix m;
  m.rows = v.size();
  m.cols = m.rows ? v[0].size() : 0;
  m.data.reserve(m.rows * m.cols);
  for (std::size_t r = 0; r < m.rows; ++r) {
    if (!v[r].is_array() || v[r].size() != m.cols)
      throw reject(std::string("input '") + name + "' row " + std::to_string(r) + " has length " +
                   std::to_string(v[r].is_array() ? v[r].size() : 0) + ", expected " + std::to_string(m.cols));
    for (const auto& x : v[r]) m.data.push_back(to_double(x));
  }
  return m;
}

std::vector<double> to_vector(const json& v, const char* name) {
  if (!v.is_array()) throw reject(std::string("input '") + name + "' must be a list");
  std::vector<double> out;
  out.reserve(v.size());
  for (const auto& x : v) out.push_back(to_double(x));
  return out;
}

std::vector<std::int64_t> to_ints(const json& v, const char* name) {
  if (!v.is_array()) throw reject(std::string("input '") + name + "' must be a list");
  std::vector<std::int64_t> out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double d = to_double(v[i]);
    if (!std::isfinite(d) || d != std::floor(d))
      throw reject(std::string("input '") + name + "'[" + std::to_string(i) + "] must be an integer");
    out.push_back(static_cast<std::int64_t>(d));
  }
  return out;
}

bool has_param(const json& params, const char* name) { return params.contains(name) && !params[name].is_null(); }
double param_double(const json& params, const char* name, double fallback) {
  return has_param(params, name) ? to_double(params[name]) : fallback;
}
std::int64_t param_int(const json& params, const char* name, std::int64_t fallback) {
  return has_param(params, name) ? params[name].get<std::int64_t>() : fallback;
}
bool param_bool(const json& params, const char* name, bool fallback) {
  return has_param(params, name) ? params[name].get<bool>() : fallback;
}
std::string param_string(const json& params, const char* name, const std::string& fallback) {
  return has_param(params, name) ? params[name].get<std::string>() : fallback;
}

json from_matrix(const matrix& m) {
  json rows = json::array();
  for (std::size_t r = 0; r < m.rows; ++r) {
    json row = json::array();
    for (std::size_t c = 0; c < m.cols; ++c) row.push_back(m(r, c));
    rows.push_back(std::move(row));
  }
  return rows;
}
json from_vector(const std::vector<double>& v) { return json(v); }

}  // namespace conformance

namespace {

using conformance::json;

json run_case(const json& c) {
  const auto op = c.value("op", std::string());
  auto& reg = conformance::registry();
  const auto it = reg.find(op);
  if (it == reg.end()) return json{{"error", "unknown op '" + op + "'"}};
  try {
    const json params = c.contains("params") ? c["params"] : json::object();
    const json inputs = c.contains("inputs") ? c["inputs"] : json::object();
    return json{{"outputs", it->second(c.value("preset", std::string()), params, inputs)}};
  } catch (const ulorl::error& e) {
    return json{{"error", e.what()}};
  } catch (const conformance::reject& e) {
    return json{{"error", e.what()}};
  } catch (const json::exception& e) {
    return json{{"error", std::string("malformed case: ") + e.what()}};
  }
}

bool close_enough(const json& actual, const json& expected, double rtol, double atol, std::string& why,
                  const std::string& path) {
  if (expected.is_array()) {
    if (!actual.is_array() || actual.size() != expected.size()) {
      why = path + ": shape differs";
      return false;
    }
    for (std::size_t i = 0; i < expected.size(); ++i)
      if (!close_enough(actual[i], expected[i], rtol, atol, why, path + "[" + std::to_string(i) + "]")) return false;
    return true;
  }
  if (!actual.is_number()) {
    why = path + ": expected a number";
    return false;
  }
  const double a = actual.get<double>(), e = conformance::to_double(expected);
  if (!std::isfinite(a) || !(std::fabs(a - e) <= atol + rtol * std::fabs(e))) {
    std::ostringstream os;
    os.precision(17);
    os << path << ": got " << a << ", expected " << e;
    why = os.str();
    return false;
  }
  return true;
}

//! Applies the README's comparison rule; returns true on pass and explains a failure in `why`.
bool check_case(const json& c, const json& result, std::string& why) {
  const json& expected = c.at("expected");
  if (expected.contains("error") && expected["error"].is_boolean()) {
    if (result.contains("error")) return true;
    why = "expected an error, got outputs";
    return false;
  }
  if (result.contains("error")) {
    why = "unexpected error: " + result["error"].get<std::string>();
    return false;
  }
  const double rtol = c.at("tolerance").value("rtol", 1e-6), atol = c.at("tolerance").value("atol", 1e-9);
  const json& out = result.at("outputs");
  for (const auto& [key, value] : expected.items()) {
    if (!out.contains(key)) {
      why = "missing output '" + key + "'";
      return false;
    }
    if (!close_enough(out[key], value, rtol, atol, why, key)) return false;
  }
  return true;
}

json load(const std::filesystem::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("cannot open " + p.string());
  return json::parse(in);
}

int usage() {
  std::cerr << "usage: ulorl-conformance run CASE.json | check DIR [--verbose] [--ops op1,op2] | ops\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
  try {
    if (cmd == "ops") {
      for (const auto& [name, h] : conformance::registry()) std::cout << name << "\n";
      return 0;
    }
    if (cmd == "run" && argc == 3) {
      std::cout << run_case(load(argv[2])).dump() << "\n";
      return 0;
    }
    if (cmd == "check" && argc >= 3) {
      bool verbose = false;
      std::vector<std::string> only;  // --ops a,b: check only these ops (others are skipped)
      for (int a = 3; a < argc; ++a) {
        const std::string arg = argv[a];
        if (arg == "--verbose") {
          verbose = true;
        } else if (arg == "--ops" && a + 1 < argc) {
          std::stringstream ss(argv[++a]);
          for (std::string op; std::getline(ss, op, ',');) only.push_back(op);
        } else {
          return usage();
        }
      }
      std::vector<std::filesystem::path> files;
      for (const auto& e : std::filesystem::directory_iterator(argv[2]))
        if (e.path().extension() == ".json") files.push_back(e.path());
      std::sort(files.begin(), files.end());
      std::size_t passed = 0, failed = 0;
      for (const auto& f : files) {
        const json c = load(f);
        if (!only.empty() && std::find(only.begin(), only.end(), c.value("op", std::string())) == only.end()) continue;
        std::string why;
        if (check_case(c, run_case(c), why)) {
          ++passed;
          if (verbose) std::cout << "PASS " << f.filename().string() << "\n";
        } else {
          ++failed;
          std::cout << "FAIL " << f.filename().string() << ": " << why << "\n";
        }
      }
      std::cout << passed << " passed, " << failed << " failed\n";
      return failed == 0 && passed > 0 ? 0 : 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "ulorl-conformance: " << e.what() << "\n";
    return 2;
  }
  return usage();
}
