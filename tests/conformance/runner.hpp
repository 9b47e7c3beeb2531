// tests/conformance/runner.hpp — one golden case from its text to its result, callable from the
// `ulorl-conformance` CLI (main.cpp) and from fuzz targets (which compile every
// tests/conformance/*.cpp except main.cpp). The README's case format: a JSON object with a string
// "op", optional "preset" (string), "params" and "inputs" (objects), and for `check` "expected"
// and "tolerance".
//
// Hostile input: any bytes give exactly one result object, never an exception or a crash. Text
// nested deeper than `max_depth` arrays / objects is rejected by a scan of the bytes before the
// JSON parser builds (or later destroys) a tree, whose recursion would otherwise exhaust the stack.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "conformance/registry.hpp"

namespace conformance {

//! Deepest array / object nesting a case may have (the golden cases use 3).
inline constexpr std::size_t max_depth = 64;

//! Runs the case in `text`: {"outputs": {...}} or {"error": "..."}; every string in the result is
//! valid UTF-8, so `dump()` cannot throw. Never throws.
json run_case_text(std::string_view text) noexcept;

//! Parses and checks the structure of a case (object, "op" a string, "preset" a string, "params"
//! and "inputs" objects, nesting <= max_depth); throws conformance::reject with the reason.
json parse_case(std::string_view text);

//! Runs a case returned by parse_case: {"outputs"} or {"error"}. Never throws.
json run_case(const json& c) noexcept;

//! Applies the README's comparison rule to a parsed case and its result: true on pass, else the
//! reason in `why` (a case without "expected", or with a malformed "tolerance", fails). Never throws.
bool check_case(const json& c, const json& result, std::string& why) noexcept;

//! {"error": message} with invalid UTF-8 in the message replaced (U+FFFD).
json error_result(const std::string& message) noexcept;

}  // namespace conformance
