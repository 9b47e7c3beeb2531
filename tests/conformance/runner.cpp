// The per-case logic of `ulorl-conformance` (see runner.hpp): the op registry, the JSON reading and
// writing helpers of registry.hpp, the structure checks of a case, running it and comparing its
// result with the expected one.
#include "conformance/runner.hpp"

#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <sstream>
#include <string>

#include <ulorl/core/error.hpp>

namespace conformance {

std::map<std::string, handler>& registry() {
  static std::map<std::string, handler> r;
  return r;
}

// ---- reading helpers ------------------------------------------------------------------------------

double to_double(const json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const auto s = v.get<std::string>();
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
  }
  if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
  throw reject("expected a number, got a JSON " + std::string(v.type_name()));
}

namespace {

std::string number_text(double d) {
  std::ostringstream os;
  os.precision(17);
  os << d;
  return os.str();
}

//! A JSON integer, or a number with an integral value, in [lo, hi] (and so in int64). The
//! conversion of a double outside int64 would be undefined behaviour: it is rejected first.
std::int64_t to_integer(const json& v, const std::string& what, std::int64_t lo, std::int64_t hi) {
  std::int64_t r = 0;
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      throw reject(what + " = " + std::to_string(u) + " is out of the range of int64");
    r = static_cast<std::int64_t>(u);
  } else if (v.is_number_integer()) {
    r = v.get<std::int64_t>();
  } else {
    const double d = to_double(v);
    if (!std::isfinite(d) || d != std::floor(d)) throw reject(what + " must be an integer, got " + number_text(d));
    // [-2^63, 2^63): exactly the doubles whose conversion to int64 is defined.
    if (!(d >= -0x1p63 && d < 0x1p63)) throw reject(what + " = " + number_text(d) + " is out of the range of int64");
    r = static_cast<std::int64_t>(d);
  }
  if (r < lo || r > hi)
    throw reject(what + " = " + std::to_string(r) + " is out of its range [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "]");
  return r;
}

}  // namespace

matrix to_matrix(const json& v, const char* name) {
  if (!v.is_array()) throw reject(std::string("input '") + name + "' must be a [B][T] list");
  matrix m;
  m.rows = v.size();
  m.cols = m.rows && v[0].is_array() ? v[0].size() : 0;
  // Every row's length first: the reservation below is then bounded by the input's size.
  for (std::size_t r = 0; r < m.rows; ++r)
    if (!v[r].is_array() || v[r].size() != m.cols)
      throw reject(std::string("input '") + name + "' row " + std::to_string(r) + " has length " +
                   std::to_string(v[r].is_array() ? v[r].size() : 0) + ", expected " + std::to_string(m.cols));
  m.data.reserve(m.rows * m.cols);
  for (std::size_t r = 0; r < m.rows; ++r)
    for (const auto& x : v[r]) m.data.push_back(to_double(x));
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
  for (std::size_t i = 0; i < v.size(); ++i)
    out.push_back(to_integer(v[i], std::string("input '") + name + "'[" + std::to_string(i) + "]",
                             std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max()));
  return out;
}

bool has_param(const json& params, const char* name) { return params.contains(name) && !params[name].is_null(); }
double param_double(const json& params, const char* name, double fallback) {
  return has_param(params, name) ? to_double(params[name]) : fallback;
}
std::int64_t param_int(const json& params, const char* name, std::int64_t fallback, std::int64_t lo, std::int64_t hi) {
  return has_param(params, name) ? to_integer(params[name], std::string("param '") + name + "'", lo, hi) : fallback;
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

// ---- a case ---------------------------------------------------------------------------------------

json error_result(const std::string& message) noexcept {
  // Round trip through the serializer with invalid bytes replaced: the result dumps without throwing.
  const std::string quoted = json(message).dump(-1, ' ', false, json::error_handler_t::replace);
  return json{{"error", json::parse(quoted)}};
}

namespace {

//! Deepest nesting of '[' / '{' outside strings (escapes honoured), stopping once past `limit`.
//! Brackets of malformed text count too, which only makes the scan stricter than the parser.
std::size_t nesting_depth(std::string_view text, std::size_t limit) noexcept {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char ch : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (ch == '\\')
        escaped = true;
      else if (ch == '"')
        in_string = false;
      continue;
    }
    if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > limit) return deepest;
    } else if ((ch == ']' || ch == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

bool optional_of_type(const json& c, const char* key, json::value_t type) {
  return !c.contains(key) || c[key].is_null() || c[key].type() == type;
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
  const double a = actual.get<double>(), e = to_double(expected);
  if (!std::isfinite(a) || !(std::fabs(a - e) <= atol + rtol * std::fabs(e))) {
    why = path + ": got " + number_text(a) + ", expected " + number_text(e);
    return false;
  }
  return true;
}

}  // namespace

json parse_case(std::string_view text) {
  if (nesting_depth(text, max_depth) > max_depth)
    throw reject("the case nests arrays / objects deeper than " + std::to_string(max_depth) + " levels");
  json c = json::parse(text.begin(), text.end());
  if (!c.is_object()) throw reject("a case must be a JSON object, got a JSON " + std::string(c.type_name()));
  if (!c.contains("op")) throw reject("the case has no 'op'");
  if (!c["op"].is_string()) throw reject("'op' must be a string, got a JSON " + std::string(c["op"].type_name()));
  if (!optional_of_type(c, "preset", json::value_t::string)) throw reject("'preset' must be a string");
  if (!optional_of_type(c, "params", json::value_t::object)) throw reject("'params' must be an object");
  if (!optional_of_type(c, "inputs", json::value_t::object)) throw reject("'inputs' must be an object");
  return c;
}

json run_case(const json& c) noexcept {
  try {
    const auto op = c.at("op").get<std::string>();
    auto& reg = registry();
    const auto it = reg.find(op);
    if (it == reg.end()) return error_result("unknown op '" + op + "'");
    const auto get = [&](const char* key, json fallback) {
      return c.contains(key) && !c[key].is_null() ? c[key] : fallback;
    };
    const json params = get("params", json::object()), inputs = get("inputs", json::object());
    const std::string preset = get("preset", json("")).get<std::string>();
    return json{{"outputs", it->second(preset, params, inputs)}};
  } catch (const ulorl::error& e) {
    return error_result(e.what());
  } catch (const reject& e) {
    return error_result(e.what());
  } catch (const json::exception& e) {
    return error_result(std::string("malformed case: ") + e.what());
  } catch (const std::exception& e) {
    return error_result(std::string("case failed: ") + e.what());
  } catch (...) {
    return error_result("case failed: unknown exception");
  }
}

json run_case_text(std::string_view text) noexcept {
  try {
    return run_case(parse_case(text));
  } catch (const reject& e) {
    return error_result(std::string("malformed case: ") + e.what());
  } catch (const std::exception& e) {
    return error_result(std::string("malformed case: ") + e.what());
  } catch (...) {
    return error_result("malformed case: unknown exception");
  }
}

bool check_case(const json& c, const json& result, std::string& why) noexcept {
  try {
    if (!c.is_object() || !c.contains("expected") || !c["expected"].is_object()) {
      why = "the case has no 'expected' object";
      return false;
    }
    const json& expected = c["expected"];
    if (expected.contains("error") && expected["error"].is_boolean()) {
      if (result.contains("error")) return true;
      why = "expected an error, got outputs";
      return false;
    }
    if (result.contains("error")) {
      why = "unexpected error: " + result["error"].get<std::string>();
      return false;
    }
    if (!c.contains("tolerance") || !c["tolerance"].is_object()) {
      why = "the case has no 'tolerance' object";
      return false;
    }
    const json& tol = c["tolerance"];
    const double rtol = tol.contains("rtol") ? to_double(tol["rtol"]) : 1e-6;
    const double atol = tol.contains("atol") ? to_double(tol["atol"]) : 1e-9;
    const json& out = result.at("outputs");
    for (const auto& [key, value] : expected.items()) {
      if (!out.contains(key)) {
        why = "missing output '" + key + "'";
        return false;
      }
      if (!close_enough(out[key], value, rtol, atol, why, key)) return false;
    }
    return true;
  } catch (const std::exception& e) {
    why = std::string("malformed case: ") + e.what();
    return false;
  } catch (...) {
    why = "malformed case: unknown exception";
    return false;
  }
}

}  // namespace conformance
