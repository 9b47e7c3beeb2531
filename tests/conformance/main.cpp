// ulorl-conformance: runs the golden cases of ../shared/golden (format: its README).
//   ulorl-conformance run CASE.json   prints exactly one JSON object, {"outputs": {...}} or
//                                     {"error": "..."}, for any file contents (exit 0; 2 when the
//                                     file cannot be read, with a JSON error all the same)
//   ulorl-conformance check DIR       runs every *.json in DIR: one FAIL line per failing or
//                                     malformed case, then "N passed, M failed"
//   ulorl-conformance ops             lists the registered ops
// The per-case logic lives in runner.cpp (shared with the fuzz targets).
#include <algorithm>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "../../examples/common/args.hpp"
#include "conformance/runner.hpp"

namespace {

using conformance::json;

bool read_file(const std::filesystem::path& p, std::string& text) {
  // ulorl's bounded reader: regular files only, never a blocking open of a FIFO or a device.
  try {
    text = cli::read_text_file("", p.string());
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

int usage() {
  std::cerr << "usage: ulorl-conformance run CASE.json | check DIR [--verbose] [--ops op1,op2] | ops\n";
  return 2;
}

int check(const std::string& dir, bool verbose, const std::vector<std::string>& only) {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::size_t passed = 0, failed = 0;
  for (const auto& f : files) {
    const std::string name = f.filename().string();
    std::string text, why;
    json c;
    bool ok = false;
    if (!read_file(f, text)) {
      why = "cannot read the file";
    } else {
      try {
        c = conformance::parse_case(text);
        ok = true;
      } catch (const std::exception& e) {
        why = std::string("malformed case: ") + e.what();
      }
    }
    if (ok && !only.empty() && std::find(only.begin(), only.end(), c["op"].get<std::string>()) == only.end()) continue;
    if (ok && conformance::check_case(c, conformance::run_case(c), why)) {
      ++passed;
      if (verbose) std::cout << "PASS " << name << "\n";
    } else {
      ++failed;
      std::cout << "FAIL " << name << ": " << why << "\n";
    }
  }
  std::cout << passed << " passed, " << failed << " failed\n";
  return failed == 0 && passed > 0 ? 0 : 1;
}

}  // namespace

int run(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
  if (cmd == "run" && argc == 3) {
    std::string text;
    if (!read_file(argv[2], text)) {
      std::cout << dump(conformance::error_result(std::string("cannot read ") + argv[2])) << "\n";
      return 2;
    }
    std::cout << dump(conformance::run_case_text(text)) << "\n";
    return 0;
  }
  try {
    if (cmd == "ops") {
      for (const auto& [name, h] : conformance::registry()) std::cout << name << "\n";
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
      return check(argv[2], verbose, only);
    }
  } catch (const std::exception& e) {
    std::cerr << "ulorl-conformance: " << e.what() << "\n";
    return 2;
  }
  return usage();
}

int main(int argc, char** argv) {
  // Any exception prints one line; the standard output is flushed and checked before the exit
  // (a full device is an error, exit status 1).
  return cli::run("ulorl-conformance", [&] { return run(argc, argv); });
}
