// tests/support/presets.hpp — helpers of the framework presets' tests (tests/test_presets_*.cpp):
// a preset's group advantages on double scores (the library's call, checked against
// advantage_oracle.hpp), and the check that an option's NaN is rejected by name.
// Internal linkage (anonymous namespace), like the tests' own helpers.
#pragma once

#include <ulorl/advantage/group_advantage.hpp>
#include <ulorl/advantage/token_broadcast.hpp>
#include <ulorl/core/error.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "catch.hpp"

namespace {
//! group_advantages of scores `s` in groups `ids` with the preset's group configuration.
inline std::vector<double> preset_advantages(const std::vector<double>& s, const std::vector<std::int64_t>& ids,
                                             const ulorl::advantage_preset& p) {
  std::vector<double> out(s.size());
  ulorl::group_advantages(std::span<const double>(s), std::span<const std::int64_t>(ids), std::span<double>(out), p.group);
  return out;
}
//! `f()` throws ulorl::error naming `arg` and saying NaN.
template <class F>
void require_nan_rejected(F&& f, const char* arg) {
  try {
    (void)f();
    FAIL("no error for " << arg);
  } catch (const ulorl::error& e) {
    CHECK(e.argument() == arg);
    CHECK(std::string(e.what()).find("NaN") != std::string::npos);
  }
}
}  // namespace
