// examples/common/args.hpp — the command-line parser and the checked file output that every ulorl
// program shares (examples/, examples/rlvr_trainer/, the conformance runner). Program support, not
// library API: it lives beside the programs and is never installed.
//
//   * A number is the whole argument or an error: std::from_chars over the entire text, base 10 for
//     integers ("1e3", "64k", "10abc", " 5", "+5" and "0x10" are refused), each flag with its own
//     range (a value outside it is refused, never wrapped or truncated: "4294967298" for a 32-bit
//     count is out of range, not 2); inf and nan are refused wherever a real must be finite.
//   * Every refusal is a usage_error whose message names the flag and the text; run() prints it as
//     one line "<program>: --flag: ..." and returns exit status 2 (usage_status).
//   * Sizes that drive allocations are bounded by their ranges before anything is allocated.
//   * Files: input files must be regular files (never a FIFO or a device that would block), read
//     through ulorl's bounded reader (ulorl/core/checkpoint_file.hpp, at most 1 GiB); output is
//     checked when it is closed (fclose / ofstream::close, so a full device is an error), and the
//     standard output is flushed and checked before the program exits (finish_stdout). Errors name
//     the flag and the file; run() prints any other std::exception (torch's c10::Error among them)
//     as its first line only, without a backtrace, and returns exit status 1 (failure_status).
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "ulorl/core/checkpoint_file.hpp"

namespace cli {

inline constexpr int usage_status = 2;    //!< a rejected command line
inline constexpr int failure_status = 1;  //!< the program failed (a file, a computation)

namespace detail {
//! `text` as one printable line: at most `limit` bytes (then "..."), control bytes as '?'.
[[nodiscard]] inline std::string printable(std::string_view text, std::size_t limit = 64) {
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < limit; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    out += c < 0x20 || c == 0x7f ? '?' : static_cast<char>(c);
  }
  if (text.size() > limit) out += "...";
  return out;
}
//! The text quoted for a message, printable() between single quotes.
[[nodiscard]] inline std::string quoted(std::string_view text) { return "'" + printable(text) + "'"; }
}  // namespace detail

//! A rejected command line. `flag()` is the flag ("--prompts"), or empty for a stray argument.
class usage_error : public std::runtime_error {
 public:
  usage_error(std::string_view flag, const std::string& what)
      : std::runtime_error(flag.empty() ? what : std::string(flag) + ": " + what), flag_(flag) {}
  [[nodiscard]] const std::string& flag() const noexcept { return flag_; }

 private:
  std::string flag_;
};

//! A file that cannot be read or written; the message names the flag (when one gave the path) and the file.
class file_error : public std::runtime_error {
 public:
  file_error(std::string_view flag, const std::string& path, const std::string& what)
      : std::runtime_error((flag.empty() ? std::string() : std::string(flag) + ": ") + "'" + detail::printable(path, 4096) +
                           "': " + detail::printable(what, 4096)) {}
};

[[noreturn]] inline void fail(std::string_view flag, const std::string& what) { throw usage_error(flag, what); }

namespace detail {
template <class T>
[[nodiscard]] std::string number_text(T v) {
  std::ostringstream os;
  os.precision(17);
  if constexpr (sizeof(T) == 1) os << static_cast<int>(v);
  else os << v;
  return os.str();
}
}  // namespace detail

//! The integer `text` in [lo, hi]; anything but a whole base-10 number in range is a usage_error
//! naming `flag`.
template <std::integral T>
[[nodiscard]] T integer(std::string_view flag, std::string_view text, T lo, T hi) {
  const std::string range = "[" + detail::number_text(lo) + ", " + detail::number_text(hi) + "]";
  T v{};
  const char* first = text.data();
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(first, last, v, 10);
  if (text.empty() || end != last || (ec != std::errc() && ec != std::errc::result_out_of_range))
    fail(flag, detail::quoted(text) + " is not a whole number (expected an integer in " + range + ")");
  if (ec == std::errc::result_out_of_range || v < lo || v > hi) fail(flag, detail::quoted(text) + " is out of range " + range);
  return v;
}

//! The real number `text`, finite, in [lo, hi] (in (lo, hi] when `lo_open`); inf, nan and trailing
//! characters are a usage_error naming `flag`.
[[nodiscard]] inline double real(std::string_view flag, std::string_view text, double lo, double hi, bool lo_open = false) {
  const std::string range = (lo_open ? "(" : "[") + detail::number_text(lo) + ", " + detail::number_text(hi) + "]";
  double v = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(first, last, v, std::chars_format::general);
  if (text.empty() || end != last || (ec != std::errc() && ec != std::errc::result_out_of_range))
    fail(flag, detail::quoted(text) + " is not a number (expected a real in " + range + ")");
  if (ec == std::errc::result_out_of_range || !std::isfinite(v)) fail(flag, detail::quoted(text) + " is not a finite number in " + range);
  if (!(lo_open ? v > lo : v >= lo) || !(v <= hi)) fail(flag, detail::quoted(text) + " is out of range " + range);
  return v;
}

//! `text` if it is one of `known`, else a usage_error naming `flag` and the known words.
[[nodiscard]] inline std::string choice(std::string_view flag, std::string_view text, std::initializer_list<std::string_view> known) {
  std::string list;
  for (const auto k : known) {
    if (k == text) return std::string(text);
    list += (list.empty() ? "" : ", ") + std::string(k);
  }
  fail(flag, detail::quoted(text) + " is not one of: " + list);
}

//! A path given to `flag`: non-empty, without NUL (argv cannot hold one, a fuzzer's input can).
[[nodiscard]] inline std::string path(std::string_view flag, std::string_view text) {
  if (text.empty()) fail(flag, "the file name is empty");
  if (text.find('\0') != std::string_view::npos) fail(flag, "the file name holds a NUL byte");
  return std::string(text);
}

//! An output path: path() whose directory exists, checked before the program does its work (the
//! file itself is written, and checked, at the end).
[[nodiscard]] inline std::string output_path(std::string_view flag, std::string_view text) {
  std::string p = path(flag, text);
  if (p.back() == '/') fail(flag, detail::quoted(p) + " names a directory, not a file");
  const std::string dir = ulorl::detail::parent_directory(p);
  struct ::stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    fail(flag, detail::quoted(p) + ": its directory " + detail::quoted(dir) + " cannot be used: " + std::generic_category().message(errno));
  if (!S_ISDIR(st.st_mode)) fail(flag, detail::quoted(p) + ": " + detail::quoted(dir) + " is not a directory");
  return p;
}

//! Walks argv: `next()` moves to the next argument, `flag()` is it, `value()` takes the argument
//! after it as the flag's value (a usage_error naming the flag when there is none).
class reader {
 public:
  reader(int argc, const char* const* argv) : argc_(argc), argv_(argv) {}
  [[nodiscard]] bool next() { return ++i_ < argc_; }
  [[nodiscard]] std::string_view flag() const { return argv_[i_]; }
  [[nodiscard]] std::string_view value() {
    if (i_ + 1 >= argc_) fail(flag(), "needs a value");
    return argv_[++i_];
  }
  //! The current argument is no option of the program: a usage_error naming it (printable, at most 64 bytes).
  [[noreturn]] void unknown() const {
    const std::string_view a = flag();
    if (a.size() > 1 && a[0] == '-') fail(detail::printable(a), "unknown option");
    fail("", "unexpected argument " + detail::quoted(a));
  }

 private:
  int argc_;
  const char* const* argv_;
  int i_ = 0;
};

//! The whole contents of the regular file `path` given by `flag` (at most 1 GiB; a FIFO, a directory
//! or a device is refused without being opened for a blocking read).
[[nodiscard]] inline std::string read_text_file(std::string_view flag, const std::string& path) {
  try {
    const auto bytes = ulorl::detail::read_file(path, "read_file");
    return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  } catch (const ulorl::error& e) {
    // "ulorl::read_file: argument 'path' = <path>: <reason>": keep the reason.
    const std::string what = e.what();
    const auto at = what.find(": ", what.find("' = ") + 4 + path.size());
    throw file_error(flag, path, at == std::string::npos ? what : what.substr(at + 2));
  }
}

//! Checks that `path` (given by `flag`) is a regular file before a library that would block on a
//! FIFO or read a device opens it; "cannot open: <reason>" or "is not a regular file" otherwise.
inline void require_regular_file(std::string_view flag, const std::string& path) {
  struct ::stat st {};
  if (::stat(path.c_str(), &st) != 0) throw file_error(flag, path, "cannot open: " + std::generic_category().message(errno));
  if (!S_ISREG(st.st_mode)) throw file_error(flag, path, "is not a regular file");
}

//! Writes `text` to `path` (given by `flag`) and closes it, checking every step: a missing
//! directory, a read-only file or a full device (/dev/full) is a file_error naming the file.
inline void write_text_file(std::string_view flag, const std::string& path, std::string_view text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) throw file_error(flag, path, "cannot open for writing: " + std::generic_category().message(errno));
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0;
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (!wrote || !closed)
    throw file_error(flag, path, "write failed: " + std::generic_category().message(wrote ? errno : write_errno));
}

//! Flushes the standard output and checks it (a closed pipe, a full device): throws naming the
//! "standard output" when anything written to it was lost.
inline void finish_stdout() {
  if (std::fflush(stdout) != 0 || std::ferror(stdout))
    throw std::runtime_error("standard output: write failed: " + std::generic_category().message(errno ? errno : EIO));
}

//! The first line of an exception's message (torch's c10::Error appends a C++ backtrace after it).
[[nodiscard]] inline std::string first_line(const char* what) {
  std::string s = what != nullptr ? what : "";
  const auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

//! Runs a program's body: returns its status, after finish_stdout(); a usage_error prints
//! "<program>: <message>" and "<program> --help lists the options" and returns usage_status; a
//! file_error or any other exception prints "<program>: <first line>" and returns failure_status.
template <class Body>
[[nodiscard]] int run(const char* program, Body&& body) noexcept {
  try {
    try {
      const int status = body();
      finish_stdout();
      return status;
    } catch (const usage_error& e) {
      std::fprintf(stderr, "%s: %s (%s --help lists the options)\n", program, first_line(e.what()).c_str(), program);
      return usage_status;
    } catch (const std::exception& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "%s: %s\n", program, first_line(e.what()).c_str());
      return failure_status;
    }
  } catch (...) {
    std::fprintf(stderr, "%s: failed (unknown exception)\n", program);
    return failure_status;
  }
}

}  // namespace cli
