// Fuzz target: the conformance runner's JSON input (tests/conformance/runner.hpp). Any bytes must
// give exactly one result object, {"outputs": {...}} or {"error": "..."}, without an exception
// escaping, a crash or UB in the runner, its op handlers or the library calls behind them; the
// result must serialise (valid UTF-8), be the same on a second run, and the README's comparison
// (check_case) must return an answer for any parsed case. Seeds: the golden cases (tests/golden).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "conformance/runner.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto result = conformance::run_case_text(text);
  FUZZ_CHECK(result.is_object() && result.size() == 1);
  FUZZ_CHECK(result.contains("outputs") != result.contains("error"));
  if (result.contains("outputs")) FUZZ_CHECK(result["outputs"].is_object());
  else FUZZ_CHECK(result["error"].is_string());
  std::string dumped;
  try {
    dumped = result.dump();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "result does not serialise: %s\n", e.what());
    FUZZ_CHECK(!"run_case_text returned a result that dump() rejects");
  }
  const std::string again = conformance::run_case_text(text).dump();
  if (again != dumped) {  // not deterministic: both results in the report (run_fuzzer.cmake prints it)
    std::fprintf(stderr,
                 "fuzz check failed: run_case_text gives two results for one input\nfirst:  %.4000s\n"
                 "second: %.4000s\n",
                 dumped.c_str(), again.c_str());
    std::abort();
  }
  if (result.contains("outputs")) {
    // A case that ran is well formed: comparing it with its own expectations never throws.
    try {
      const auto c = conformance::parse_case(text);
      std::string why;
      (void)conformance::check_case(c, result, why);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "a case that ran does not parse again: %s\n", e.what());
      FUZZ_CHECK(!"parse_case rejects a case that run_case_text ran");
    }
  }
  return 0;
}
