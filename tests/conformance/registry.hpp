// tests/conformance/registry.hpp — the op registry of `ulorl-conformance`. Each op_<name>.cpp file
// registers a handler: it reads a case's params/inputs (nlohmann::json) and returns its outputs.
// A handler rejects bad input by letting ulorl::error (or conformance::reject) propagate.
#pragma once

#include <nlohmann/json.hpp>
#include <ulorl/core/ragged.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace conformance {

using json = nlohmann::json;
//! (params, inputs, preset) -> outputs object.
using handler = std::function<json(const std::string& preset, const json& params, const json& inputs)>;

std::map<std::string, handler>& registry();

struct registrar {
  registrar(const std::string& op, handler h) { registry()[op] = std::move(h); }
};

//! Input rejected by the runner itself (a malformed case rather than a library precondition).
struct reject : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---- reading helpers ------------------------------------------------------------------------------
//! A JSON number, or one of the strings "NaN", "Infinity", "-Infinity".
double to_double(const json& v);

//! A [B][T] matrix flattened row-major; throws reject when rows differ in length.
struct matrix {
  std::size_t rows = 0, cols = 0;
  std::vector<double> data;
  double& operator()(std::size_t r, std::size_t c) { return data[r * cols + c]; }
  double operator()(std::size_t r, std::size_t c) const { return data[r * cols + c]; }
};
matrix to_matrix(const json& v, const char* name);
std::vector<double> to_vector(const json& v, const char* name);
//! An optional [B][T] input: absent or `null` gives nullopt.
inline std::optional<matrix> optional_matrix(const json& inputs, const char* name) {
  if (inputs.contains(name) && !inputs[name].is_null()) return to_matrix(inputs[name], name);
  return std::nullopt;
}
//! Integers (JSON integers or integral numbers) in the range of int64; otherwise reject names the index.
std::vector<std::int64_t> to_ints(const json& v, const char* name);

//! Parameter lookup: `null` or absent gives the fallback.
double param_double(const json& params, const char* name, double fallback);
//! An integral parameter in [lo, hi] (a JSON integer or an integral number); otherwise reject names it.
std::int64_t param_int(const json& params, const char* name, std::int64_t fallback,
                       std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                       std::int64_t hi = std::numeric_limits<std::int64_t>::max());
bool param_bool(const json& params, const char* name, bool fallback);
std::string param_string(const json& params, const char* name, const std::string& fallback);
bool has_param(const json& params, const char* name);

//! A parameter that may be null or absent.
inline std::optional<double> param_optional(const json& params, const char* name) {
  return has_param(params, name) ? std::optional<double>(param_double(params, name, 0.0)) : std::nullopt;
}
//! A [B][T] matrix as the padded ragged layout.
inline ulorl::token_view<const double> padded_view(const matrix& m) {
  return ulorl::padded(ulorl::matrix_view<const double>(m.data.data(), m.rows, m.cols));
}
inline ulorl::token_view<double> padded_view(matrix& m) {
  return ulorl::padded(ulorl::matrix_view<double>(m.data.data(), m.rows, m.cols));
}

// ---- writing helpers ------------------------------------------------------------------------------
json from_matrix(const matrix& m);
json from_vector(const std::vector<double>& v);

}  // namespace conformance
