// Fuzz target: the programs' command-line parser (examples/common/args.hpp). The input is split at
// NUL bytes into argv (at most 32 arguments) and parsed against a table of flags of every kind the
// programs use (integers of 32 and 64 bits, signed and unsigned, with their ranges; finite reals in
// closed and half-open ranges; words from a list; comma-separated lists; paths; switches). Each
// parse either succeeds, and then every value lies in its flag's range (a real is finite), or throws
// cli::usage_error whose message starts with the flag it names (or, for a stray argument, says so);
// nothing else may escape, and nothing may crash. A parsed number is also checked against an
// independent reading of its text (digits only, for integers).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "../../examples/common/args.hpp"

namespace {

[[noreturn]] void die(const char* what, std::string_view detail) {
  std::fprintf(stderr, "fuzz_args: %s: %.*s\n", what, static_cast<int>(detail.size()), detail.data());
  std::abort();
}

//! The integer a whole decimal text denotes, or false (an independent reading: digits only,
//! an optional leading '-', no overflow).
bool reference_integer(std::string_view t, long double& out) {
  bool neg = false;
  if (!t.empty() && t[0] == '-') neg = true, t.remove_prefix(1);
  if (t.empty()) return false;
  while (t.size() > 1 && t[0] == '0') t.remove_prefix(1);  // leading zeros are a whole number too
  if (t.size() > 40) return false;
  long double v = 0;
  for (const char c : t) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  out = neg ? -v : v;
  return true;
}

template <class T>
void check_integer(std::string_view flag, std::string_view text, T lo, T hi) {
  long double ref = 0;
  const bool whole = reference_integer(text, ref);
  try {
    const T v = cli::integer<T>(flag, text, lo, hi);
    if (v < lo || v > hi) die("integer out of its range", text);
    if (!whole || ref != static_cast<long double>(v)) die("integer differs from its text", text);
  } catch (const cli::usage_error& e) {
    if (e.flag() != flag || std::string_view(e.what()).substr(0, flag.size() + 2) != std::string(flag) + ": ")
      die("integer error does not name the flag", e.what());
    // Refused only when the text is not a whole number or lies outside the range (a negative
    // text for an unsigned type counts as outside).
    if (whole && ref >= static_cast<long double>(lo) && ref <= static_cast<long double>(hi) &&
        !(std::is_unsigned_v<T> && !text.empty() && text[0] == '-'))
      die("integer in range refused", text);
  }
}

void check_real(std::string_view flag, std::string_view text, double lo, double hi, bool lo_open) {
  try {
    const double v = cli::real(flag, text, lo, hi, lo_open);
    if (!std::isfinite(v) || !(lo_open ? v > lo : v >= lo) || !(v <= hi)) die("real out of its range", text);
    // strtod agrees on the whole text (from_chars and strtod round the same way).
    const std::string s(text);
    char* end = nullptr;
    const double r = std::strtod(s.c_str(), &end);
    if (end != s.c_str() + s.size() || r != v) die("real differs from strtod", text);
  } catch (const cli::usage_error& e) {
    if (e.flag() != flag || std::string_view(e.what()).substr(0, flag.size() + 2) != std::string(flag) + ": ")
      die("real error does not name the flag", e.what());
  }
}

struct parsed {
  int steps = 0;
  std::int64_t tokens = 0;
  std::uint64_t seed = 0;
  double lr = 0, sigma = 0;
  std::string mode, file;
  std::vector<std::int32_t> segments;
  bool json = false;
};

//! A program's parse loop over the fuzzed argv, as the programs write it.
parsed parse(const std::vector<const char*>& argv) {
  parsed o;
  cli::reader args(static_cast<int>(argv.size()), argv.data());
  while (args.next()) {
    const std::string_view a = args.flag();
    if (a == "--json") o.json = true;
    else if (a == "--steps") o.steps = cli::integer(a, args.value(), 0, 1'000'000);
    else if (a == "--tokens") o.tokens = cli::integer<std::int64_t>(a, args.value(), 1, std::int64_t{1} << 40);
    else if (a == "--seed") o.seed = cli::integer<std::uint64_t>(a, args.value(), 0, UINT64_MAX);
    else if (a == "--lr") o.lr = cli::real(a, args.value(), 0, 1, true);
    else if (a == "--sigma") o.sigma = cli::real(a, args.value(), 0, 100);
    else if (a == "--mode") o.mode = cli::choice(a, args.value(), {"off", "static", "dynamic"});
    else if (a == "--file") o.file = cli::path(a, args.value());
    else if (a == "--segments") {
      const std::string_view v = args.value();
      for (std::size_t at = 0;;) {
        const auto comma = v.find(',', at);
        const auto item = v.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at);
        o.segments.push_back(cli::integer<std::int32_t>(a, item, 1, INT32_MAX));
        if (comma == std::string_view::npos) break;
        at = comma + 1;
      }
    } else args.unknown();
  }
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // argv[0] is the program; the rest are the input's NUL-separated pieces.
  std::vector<std::string> pieces(1, "prog");
  pieces.emplace_back();
  for (std::size_t i = 0; i < size && pieces.size() <= 32; ++i) {
    if (data[i] == 0) pieces.emplace_back();
    else pieces.back() += static_cast<char>(data[i]);
  }
  if (size == 0) pieces.pop_back();
  std::vector<const char*> argv;
  for (const auto& p : pieces) argv.push_back(p.c_str());

  try {
    const parsed o = parse(argv);
    if (o.steps < 0 || o.steps > 1'000'000) die("--steps out of range", "");
    if (o.tokens != 0 && (o.tokens < 1 || o.tokens > (std::int64_t{1} << 40))) die("--tokens out of range", "");
    if (o.lr != 0 && !(o.lr > 0 && o.lr <= 1)) die("--lr out of range", "");
    if (!(o.sigma >= 0 && o.sigma <= 100)) die("--sigma out of range", "");
    if (!o.mode.empty() && o.mode != "off" && o.mode != "static" && o.mode != "dynamic") die("--mode not a known word", o.mode);
    for (const auto n : o.segments)
      if (n < 1) die("--segments entry out of range", "");
  } catch (const cli::usage_error& e) {
    const std::string_view what = e.what();
    if (e.flag().empty() ? what.substr(0, 20) != "unexpected argument " : what.substr(0, e.flag().size() + 2) != e.flag() + ": ")
      die("error names no flag", what);
    if (what.find('\n') != std::string_view::npos) die("error is not one line", what);
  }

  // Each argument also through every number reader directly, against the independent readings.
  for (std::size_t i = 1; i < pieces.size(); ++i) {
    const std::string_view t = pieces[i];
    check_integer<int>("--int", t, -5, 1'000'000);
    check_integer<std::int64_t>("--i64", t, INT64_MIN, INT64_MAX);
    check_integer<std::uint64_t>("--u64", t, 0, UINT64_MAX);
    check_integer<std::int32_t>("--i32", t, 1, INT32_MAX);
    check_real("--real", t, 0, 1e6, true);
    check_real("--any", t, -1e308, 1e308, false);
  }
  return 0;
}
