// Tests of ulorl/core/checkpoint_file.hpp (POSIX): round trips of the three controllers through a
// file; a writer process SIGKILLed at random instants while it replaces one checkpoint file again
// and again, after which the file must restore to exactly the state of the last completed write or
// of the write in flight (never garbage, never missing); error paths (missing or unwritable
// directory, a directory as the path, a failing write, missing, non-regular and oversized files),
// each leaving no temporary behind; a FIFO nobody writes to, a directory and a device, refused by
// every reader without blocking.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <ulorl/control/entropy_controller.hpp>
#include <ulorl/control/kl_controller.hpp>
#include <ulorl/control/reference_reset.hpp>
#include <ulorl/core/checkpoint_file.hpp>

#include "catch.hpp"
#include "support/fifo_watchdog.hpp"

namespace {

constexpr std::uint64_t kSeed = 5150001;

//! A fresh directory under $TMPDIR (or /tmp), removed with its files at scope exit.
struct temp_dir {
  std::string path;
  temp_dir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ulorl_ckpt_XXXXXX";
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~temp_dir() {
    for (const auto& name : entries()) (void)::unlink((path + "/" + name).c_str());
    (void)::rmdir(path.c_str());
  }
  [[nodiscard]] std::vector<std::string> entries() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(path.c_str())) {
      while (const dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") out.push_back(n);
      }
      ::closedir(d);
    }
    return out;
  }
  [[nodiscard]] std::size_t temporaries() const {
    std::size_t n = 0;
    for (const auto& name : entries()) n += name.find(".tmp.") != std::string::npos;
    return n;
  }
};

std::vector<std::byte> file_bytes(const std::string& path) { return ulorl::detail::read_file(path, "test"); }

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const ulorl::error& e) {
    CHECK(e.argument() == "path");
    return e.what();
  }
  return "<no error>";
}

//! The writer's progress, in memory shared with the parent: write k of the sequence has begun when
//! started == k and completed (renamed and the directory synced) when done == k.
struct progress {
  std::atomic<std::uint64_t> started;
  std::atomic<std::uint64_t> done;
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

}  // namespace

TEST_CASE("checkpoint files round-trip every controller", "[core][checkpoint_file]") {
  temp_dir dir;
  ulorl::kl_controller kl({.type = ulorl::kl_control_type::adaptive, .init_coef = 0.01});
  kl.update(0.3, 128);
  ulorl::save_to_file(kl, dir.path + "/kl.ckpt");
  CHECK(ulorl::restore_from_file<ulorl::kl_controller>(dir.path + "/kl.ckpt").save() == kl.save());
  ulorl::entropy_controller ent({.init_coef = 0.02});
  ent.update(0.05);
  ulorl::save_to_file(ent, dir.path + "/ent.ckpt");
  CHECK(ulorl::restore_from_file<ulorl::entropy_controller>(dir.path + "/ent.ckpt").save() == ent.save());
  ulorl::reference_reset_policy rr({.every_n_steps = 3});
  rr.observe_step(4, 0.1, 1.0);
  ulorl::save_to_file(rr, dir.path + "/rr.ckpt");
  CHECK(ulorl::restore_from_file<ulorl::reference_reset_policy>(dir.path + "/rr.ckpt").save() == rr.save());
  // Replacing a file, and a bare relative name (directory ".").
  kl.update(0.01, 64);
  ulorl::save_to_file(kl, dir.path + "/kl.ckpt");
  CHECK(file_bytes(dir.path + "/kl.ckpt") == kl.save());
  CHECK(ulorl::detail::parent_directory("kl.ckpt") == ".");
  CHECK(ulorl::detail::parent_directory("/kl.ckpt") == "/");
  CHECK(ulorl::detail::parent_directory("a/b/kl.ckpt") == "a/b");
  CHECK(dir.temporaries() == 0);
  // A checkpoint of another kind in the file is the machine's own error.
  CHECK_THROWS_WITH(ulorl::restore_from_file<ulorl::kl_controller>(dir.path + "/ent.ckpt"),
                    Catch::Contains("kl_controller::restore") && Catch::Contains("another kind"));
}

TEST_CASE("a writer killed at a random instant leaves the old or the new checkpoint", "[core][checkpoint_file][crash]") {
  // Two states of one controller, written alternately: write k holds A for even k, B for odd k.
  ulorl::kl_controller a({.type = ulorl::kl_control_type::adaptive, .init_coef = 0.01});
  ulorl::kl_controller b = a;
  b.update(0.5, 1000);
  const auto bytes_a = a.save(), bytes_b = b.save();
  REQUIRE(bytes_a != bytes_b);
  REQUIRE(bytes_a.size() == bytes_b.size());  // a torn write could not be told apart by its length

  temp_dir dir;
  const std::string path = dir.path + "/state.ckpt";
  void* mem = ::mmap(nullptr, sizeof(progress), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mem != MAP_FAILED);
  auto* shared = new (mem) progress{};
  // What one atomic replacement costs here (two fsyncs), to read the kill figures against.
  const auto m0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) ulorl::save_to_file(i % 2 == 0 ? b : a, path);
  const double write_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - m0).count() / 20;
  ulorl::save_to_file(a, path);  // write 0: from here on the file must always exist
  shared->started = 0;
  shared->done = 0;

  constexpr int kills = 1000;
  std::printf("test_core_checkpoint_file seed %llu\n", static_cast<unsigned long long>(kSeed));
  std::mt19937_64 rng(kSeed);
  std::uniform_int_distribution<int> delay_us(0, 3000);
  int landed_old = 0, landed_new = 0, between = 0, garbage = 0, missing = 0;
  std::uint64_t writes = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int kill = 0; kill < kills; ++kill) {
    const std::uint64_t first = shared->done.load() + 1;
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // The writer: never returns into the test framework.
      try {
        for (std::uint64_t k = first;; ++k) {
          shared->started.store(k);
          ulorl::save_to_file(k % 2 == 0 ? a : b, path);
          shared->done.store(k);
        }
      } catch (...) {
        ::_exit(3);
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    REQUIRE(::kill(pid, SIGKILL) == 0);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFSIGNALED(status));
    REQUIRE(WTERMSIG(status) == SIGKILL);

    const std::uint64_t started = shared->started.load(), done = shared->done.load();
    REQUIRE((started == done || started == done + 1));
    std::vector<std::byte> got;
    try {
      got = file_bytes(path);
    } catch (const ulorl::error& e) {
      INFO("kill " << kill << ": " << e.what());
      ++missing;
      FAIL_CHECK("checkpoint file unreadable");
      continue;
    }
    const auto& want_done = done % 2 == 0 ? bytes_a : bytes_b;
    const auto& want_started = started % 2 == 0 ? bytes_a : bytes_b;
    std::uint64_t now_holds = done;
    if (got == want_done) {
      if (started == done)
        ++between;
      else
        ++landed_old;
    } else if (started != done && got == want_started) {
      ++landed_new;  // renamed, killed before it could record the write as done
      now_holds = started;
    } else {
      ++garbage;
      INFO("kill " << kill << ": started " << started << ", done " << done << ", file of " << got.size() << " bytes");
      FAIL_CHECK("checkpoint file holds neither the old nor the new state");
    }
    // The restored machine is exactly the state of the write the file holds.
    CHECK(ulorl::restore_from_file<ulorl::kl_controller>(path).save() == (now_holds % 2 == 0 ? bytes_a : bytes_b));
    writes = now_holds;
    shared->started = now_holds;
    shared->done = now_holds;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::size_t leftovers = dir.temporaries();
  std::printf("checkpoint kill test: %d kills (delays 0-3 ms), %llu completed writes of %zu bytes (%.2f ms each), "
              "killed mid-write: %d landed on the old state, %d on the new; %d between writes; garbage %d, "
              "missing %d; %zu temporaries left by killed writers; %.2f s\n",
              kills, static_cast<unsigned long long>(writes), bytes_a.size(), write_ms, landed_old, landed_new,
              between, garbage, missing, leftovers, seconds);
  CHECK(garbage == 0);
  CHECK(missing == 0);
  CHECK(landed_old + landed_new + between == kills);
  CHECK(landed_old > 0);  // the kills do land inside writes, not only between them
  CHECK(writes > 0);
  ::munmap(mem, sizeof(progress));
}

TEST_CASE("checkpoint file errors name the path and leave no temporary", "[core][checkpoint_file][error]") {
  temp_dir dir;
  const auto bytes = ulorl::kl_controller().save();
  SECTION("missing directory") {
    const std::string p = dir.path + "/no/such/dir/x.ckpt";
    const auto msg = error_of([&] { ulorl::detail::write_file_atomically(p, bytes); });
    CHECK_THAT(msg, Catch::Contains("ulorl::write_file_atomically: argument 'path' = " + p) &&
                        Catch::Contains("cannot create the temporary") && Catch::Contains("No such file or directory"));
  }
  SECTION("unwritable directory") {
    if (::geteuid() != 0) {
      const std::string ro = dir.path + "/ro";
      REQUIRE(::mkdir(ro.c_str(), 0555) == 0);
      const auto msg = error_of([&] { ulorl::detail::write_file_atomically(ro + "/x.ckpt", bytes); });
      CHECK_THAT(msg, Catch::Contains("Permission denied"));
      (void)::chmod(ro.c_str(), 0755);
      (void)::rmdir(ro.c_str());
    } else {
      // Root ignores directory permissions; sysfs refuses new files even to root (only where /sys
      // is sysfs: in a chroot or container it can be a plain directory).
      struct ::statfs fs {};
      if (::statfs("/sys", &fs) == 0 && fs.f_type == static_cast<decltype(fs.f_type)>(0x62656572)) {  // SYSFS_MAGIC
        const auto msg = error_of([&] { ulorl::detail::write_file_atomically("/sys/ulorl_test.ckpt", bytes); });
        CHECK_THAT(msg, Catch::Contains("cannot create the temporary"));
      } else {
        WARN("running as root without sysfs at /sys: the unwritable-directory case is not exercised");
      }
    }
  }
  SECTION("the path is a directory") {
    const std::string sub = dir.path + "/sub";
    REQUIRE(::mkdir(sub.c_str(), 0755) == 0);
    const auto msg = error_of([&] { ulorl::detail::write_file_atomically(sub, bytes); });
    CHECK_THAT(msg, Catch::Contains("cannot rename the temporary") && Catch::Contains("directory"));
    CHECK(dir.temporaries() == 0);  // written in full, then removed when the rename failed
    CHECK_THAT(error_of([&] { ulorl::detail::write_file_atomically(sub + "/", bytes); }),
               Catch::Contains("names a directory"));
    CHECK_THAT(error_of([&] { (void)ulorl::detail::read_file(sub, "restore_from_file"); }),
               Catch::Contains("ulorl::restore_from_file: argument 'path'") && Catch::Contains("is not a regular file"));
    (void)::rmdir(sub.c_str());
  }
  SECTION("a write that fails part way removes its temporary and keeps the old file") {
    const std::string p = dir.path + "/big.ckpt";
    ulorl::detail::write_file_atomically(p, bytes);
    // In a child, limit file sizes to 64 bytes: the temporary's write fails with EFBIG after a
    // short write of 64 bytes.
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::signal(SIGXFSZ, SIG_IGN);
      const ::rlimit lim{64, 64};
      if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(10);
      const std::vector<std::byte> large(1000, std::byte{7});
      try {
        ulorl::detail::write_file_atomically(p, large);
        ::_exit(11);
      } catch (const ulorl::error& e) {
        if (std::string(e.what()).find("cannot write the temporary") == std::string::npos) ::_exit(12);
      }
      ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(dir.temporaries() == 0);
    CHECK(file_bytes(p) == bytes);
  }
  SECTION("reading: missing, empty, garbage and oversized files") {
    const std::string missing = dir.path + "/missing.ckpt";
    CHECK_THAT(error_of([&] { (void)ulorl::restore_from_file<ulorl::kl_controller>(missing); }),
               Catch::Contains("ulorl::restore_from_file: argument 'path' = " + missing) &&
                   Catch::Contains("No such file or directory"));
    const std::string empty = dir.path + "/empty.ckpt";
    ulorl::detail::write_file_atomically(empty, {});
    CHECK(file_bytes(empty).empty());
    CHECK_THROWS_WITH(ulorl::restore_from_file<ulorl::kl_controller>(empty), Catch::Contains("truncated"));
    const std::string huge = dir.path + "/huge.ckpt";
    {
      const int fd = ::open(huge.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
      REQUIRE(fd >= 0);
      REQUIRE(::ftruncate(fd, static_cast<off_t>(ulorl::checkpoint_file_max_bytes + 1)) == 0);  // sparse
      ::close(fd);
    }
    CHECK_THAT(error_of([&] { (void)ulorl::restore_from_file<ulorl::kl_controller>(huge); }),
               Catch::Contains("1073741825 bytes, more than checkpoint_file_max_bytes (1 GiB)"));
    CHECK_THAT(error_of([&] { ulorl::detail::write_file_atomically("", bytes); }), Catch::Contains("must not be empty"));
  }
  CHECK(dir.temporaries() == 0);
}

TEST_CASE("checkpoint readers refuse a FIFO, a directory and a device without blocking", "[core][checkpoint_file][error]") {
  temp_dir dir;
  const std::string fifo = dir.path + "/pipe.ckpt";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  // Nobody writes to the FIFO: a reader that opened it would wait in open(2) until the watchdog
  // opens the other end (fifo_watchdog.hpp), and the test would record that instead of hanging.
  const auto refused = [&](const std::string& path, const std::string& fn, auto&& call) {
    std::string msg;
    const bool blocked = blocked_on_fifo(fifo, [&] { msg = error_of(call); });
    CHECK_FALSE(blocked);
    CHECK_THAT(msg, Catch::Contains("ulorl::" + fn + ": argument 'path' = " + path) && Catch::Contains("is not a regular file"));
  };
  refused(fifo, "restore_from_file", [&] { (void)ulorl::restore_from_file<ulorl::kl_controller>(fifo); });
  refused(fifo, "restore_from_file", [&] { (void)ulorl::restore_from_file<ulorl::entropy_controller>(fifo); });
  refused(fifo, "restore_from_file", [&] { (void)ulorl::restore_from_file<ulorl::reference_reset_policy>(fifo); });
  refused(fifo, "reader", [&] { (void)ulorl::detail::read_file(fifo, "reader"); });
  refused(fifo, "reader", [&] { (void)::close(ulorl::detail::open_regular_file(fifo, "reader")); });
  refused(dir.path, "reader", [&] { (void)::close(ulorl::detail::open_regular_file(dir.path, "reader")); });
  struct ::stat st {};
  if (::stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode))
    refused("/dev/null", "restore_from_file", [&] { (void)ulorl::restore_from_file<ulorl::kl_controller>("/dev/null"); });
  // is_regular_file examines without opening: false for the FIFO, a directory, a missing path.
  CHECK_FALSE(blocked_on_fifo(fifo, [&] { CHECK_FALSE(ulorl::detail::is_regular_file(fifo)); }));
  CHECK_FALSE(ulorl::detail::is_regular_file(dir.path));
  CHECK_FALSE(ulorl::detail::is_regular_file(dir.path + "/missing"));
  CHECK_FALSE(ulorl::detail::is_regular_file(""));
  // A regular file is read as before (open_regular_file leaves the descriptor blocking).
  const std::string file = dir.path + "/kl.ckpt";
  ulorl::save_to_file(ulorl::kl_controller(), file);
  CHECK(ulorl::detail::is_regular_file(file));
  const int fd = ulorl::detail::open_regular_file(file, "reader");
  CHECK((::fcntl(fd, F_GETFL) & O_NONBLOCK) == 0);
  ::close(fd);
  CHECK(ulorl::restore_from_file<ulorl::kl_controller>(file).save() == ulorl::kl_controller().save());
  // Saving over the FIFO replaces it by a regular file (rename), without opening it.
  CHECK_FALSE(blocked_on_fifo(fifo, [&] { ulorl::save_to_file(ulorl::kl_controller(), fifo); }));
  CHECK(ulorl::detail::is_regular_file(fifo));
  CHECK(dir.temporaries() == 0);
}
