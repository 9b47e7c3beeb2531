// ulorl/core/checkpoint_file.hpp — crash-safe checkpoint files (POSIX). A checkpoint file is
// replaced atomically: the bytes go to a fresh temporary in the target's directory, which is
// written in full, fsync'ed, closed and renamed over the target, and the directory is then fsync'ed.
// rename(2) replaces a directory entry atomically, so a process killed at any instant leaves the
// path holding the old checkpoint or the new one, complete, never a mix or a missing file (once one
// write has completed); the fsyncs make the same hold across a power loss on file systems that honour
// them (ext4, xfs; on macOS fsync does not flush the drive's cache). A killed writer can leave its
// temporary behind: "<path>.tmp.<pid>.<n>", safe to delete. Reading is bounded by
// checkpoint_file_max_bytes (1 GiB), so a wrong path cannot make the reader allocate without limit,
// and takes regular files only, checked without blocking (open_regular_file), so a wrong path cannot
// make it wait forever either (a FIFO nobody writes to, a terminal, a device).
// The machines (KL and entropy controllers, reference-reset policy) each check their own bytes on
// restore (core/checkpoint.hpp's envelope and CRC-64, then every field), see docs/checkpoints.md.
#pragma once

#if !defined(__unix__) && !defined(__APPLE__)
#error "ulorl/core/checkpoint_file.hpp needs POSIX file APIs (open, fsync, rename)"
#endif

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"

ULORL_NAMESPACE_BEGIN

//! The largest checkpoint file read_file / restore_from_file accept (1 GiB).
inline constexpr std::uint64_t checkpoint_file_max_bytes = std::uint64_t{1} << 30;

namespace detail {

[[nodiscard]] inline std::string errno_text(int e) { return std::generic_category().message(e); }

[[noreturn]] inline void fail_file(std::string_view fn, const std::string& path, const std::string& what, int e) {
  fail_value(fn, "path", path, what + ": " + errno_text(e) + " (errno " + std::to_string(e) + ")");
}

//! The directory that holds `path` (the part before the last '/', "/" for a file in the root, "."
//! for a bare name).
[[nodiscard]] inline std::string parent_directory(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

//! close(2) without retrying EINTR: on Linux the descriptor is released even then, and a retry
//! could close a descriptor another thread has just been given.
inline int close_once(int fd) noexcept { return ::close(fd); }

//! Writes `bytes` to `path` so that `path` always holds either its previous contents or all of
//! `bytes` (see the header comment). On any failure the temporary is removed and ulorl::error names
//! the path and the system's reason; `path` is then unchanged, except when only the final fsync of
//! the directory fails, which the message says.
inline void write_file_atomically(const std::string& path, std::span<const std::byte> bytes) {
  constexpr std::string_view fn = "write_file_atomically";
  if (path.empty()) fail(fn, "path", "must not be empty");
  if (path.back() == '/') fail_value(fn, "path", path, "names a directory, not a file");

  // A name no other writer uses: the process id tells processes apart, the counter tells calls of
  // this process apart (threads included); O_EXCL makes a collision with a leftover fail, and the
  // next number is tried.
  static std::atomic<std::uint64_t> counter{0};
  const std::string stem = path + ".tmp." + std::to_string(static_cast<long long>(::getpid())) + ".";
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    tmp = stem + std::to_string(counter.fetch_add(1, std::memory_order_relaxed));
    do {
      fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0 && errno != EEXIST) fail_file(fn, path, "cannot create the temporary '" + tmp + "'", errno);
  }
  if (fd < 0) fail_file(fn, path, "cannot find an unused temporary name after 100 tries ('" + tmp + "')", EEXIST);

  auto abandon = [&](const std::string& what, int e) {
    if (fd >= 0) (void)close_once(fd);
    (void)::unlink(tmp.c_str());
    fail_file(fn, path, what, e);
  };
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ::ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      abandon("cannot write the temporary '" + tmp + "'", errno);
    }
    if (n == 0) abandon("write to the temporary '" + tmp + "' made no progress", EIO);
    done += static_cast<std::size_t>(n);
  }
  int rc;
  do {
    rc = ::fsync(fd);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) abandon("cannot fsync the temporary '" + tmp + "'", errno);
  rc = close_once(fd);
  const int close_errno = errno;
  fd = -1;
  if (rc != 0 && close_errno != EINTR) abandon("cannot close the temporary '" + tmp + "'", close_errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) abandon("cannot rename the temporary '" + tmp + "' over it", errno);

  // The new directory entry is durable only once the directory itself is synced.
  const std::string dir = parent_directory(path);
  int dfd;
  do {
    dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);  // a directory, never waited for
  } while (dfd < 0 && errno == EINTR);
  if (dfd < 0) fail_file(fn, path, "written and renamed, but cannot open its directory '" + dir + "' to fsync it", errno);
  do {
    rc = ::fsync(dfd);
  } while (rc != 0 && errno == EINTR);
  const int sync_errno = errno;
  (void)close_once(dfd);
  // Some file systems do not sync directories (EINVAL): the rename is then as durable as they make it.
  if (rc != 0 && sync_errno != EINVAL)
    fail_file(fn, path, "written and renamed, but fsync of its directory '" + dir + "' failed", sync_errno);
}

//! Whether `path` names a regular file (following symbolic links). stat(2) never opens the file,
//! so this never blocks, whatever `path` is (a FIFO, a terminal, a device); false when it does not
//! exist or cannot be examined. For a program's "does the file exist" check before a read.
[[nodiscard]] inline bool is_regular_file(const std::string& path) noexcept {
  struct ::stat st {};
  return !path.empty() && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

//! Opens the regular file `path` for reading and returns its descriptor (the caller closes it);
//! `fn` names the caller in errors. Nothing that is not a regular file is ever waited for: the path
//! is examined with stat(2) first, so a FIFO, a directory or a device is refused without being
//! opened; the open itself is non-blocking (O_NONBLOCK, O_NOCTTY), and the opened file is examined
//! again with fstat(2), so a file swapped in between is refused as well, before O_NONBLOCK is
//! cleared for the reads. Errors: "cannot open" (with the system's reason, e.g. a missing file) or
//! "is not a regular file".
[[nodiscard]] inline int open_regular_file(const std::string& path, std::string_view fn) {
  if (path.empty()) fail(fn, "path", "must not be empty");
  const auto not_regular = [&](mode_t mode) {
    fail_file(fn, path, "is not a regular file", S_ISDIR(mode) ? EISDIR : EINVAL);
  };
  struct ::stat st {};
  if (::stat(path.c_str(), &st) != 0) fail_file(fn, path, "cannot open", errno);
  if (!S_ISREG(st.st_mode)) not_regular(st.st_mode);
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) fail_file(fn, path, "cannot open", errno);
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    (void)close_once(fd);
    fail_file(fn, path, "cannot stat", e);
  }
  if (!S_ISREG(st.st_mode)) {
    (void)close_once(fd);
    not_regular(st.st_mode);
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int e = errno;
    (void)close_once(fd);
    fail_file(fn, path, "cannot clear O_NONBLOCK", e);
  }
  return fd;
}

//! The whole contents of the regular file `path`; `fn` names the caller in errors. Refuses a
//! missing file, a directory or other non-regular file without blocking (open_regular_file), and a
//! file larger than checkpoint_file_max_bytes (1 GiB), before reading it.
[[nodiscard]] inline std::vector<std::byte> read_file(const std::string& path, std::string_view fn) {
  const int fd = open_regular_file(path, fn);
  auto give_up = [&](const std::string& what, int e) {
    (void)close_once(fd);
    fail_file(fn, path, what, e);
  };
  struct ::stat st {};
  if (::fstat(fd, &st) != 0) give_up("cannot stat", errno);
  if (st.st_size < 0 || static_cast<std::uint64_t>(st.st_size) > checkpoint_file_max_bytes) {
    (void)close_once(fd);
    fail_value(fn, "path", path,
               "file has " + std::to_string(static_cast<long long>(st.st_size)) +
                   " bytes, more than checkpoint_file_max_bytes (1 GiB)");
  }
  // Read to end of file, but never past the limit (the file may grow while it is read).
  std::vector<std::byte> out(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  for (;;) {
    if (done == out.size()) {
      if (out.size() >= checkpoint_file_max_bytes) {
        std::byte probe;
        ::ssize_t n;
        do {
          n = ::read(fd, &probe, 1);
        } while (n < 0 && errno == EINTR);
        if (n < 0) give_up("cannot read", errno);
        if (n > 0) {
          (void)close_once(fd);
          fail_value(fn, "path", path, "file grew past checkpoint_file_max_bytes (1 GiB) while being read");
        }
        break;
      }
      out.resize(out.size() + 4096 < checkpoint_file_max_bytes ? out.size() + 4096
                                                                : static_cast<std::size_t>(checkpoint_file_max_bytes));
    }
    const ::ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      give_up("cannot read", errno);
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  (void)close_once(fd);
  out.resize(done);
  return out;
}

}  // namespace detail

//! A state machine with a checkpoint: `m.save()` gives its bytes, `Machine::restore(bytes)` rebuilds it.
template <class Machine>
concept checkpointable = requires(const Machine& m, std::span<const std::byte> bytes) {
  { m.save() } -> std::convertible_to<std::vector<std::byte>>;
  { Machine::restore(bytes) } -> std::same_as<Machine>;
};

//! Saves `m` to `path`, atomically (detail::write_file_atomically).
template <checkpointable Machine>
void save_to_file(const Machine& m, const std::string& path) {
  const std::vector<std::byte> bytes = m.save();
  detail::write_file_atomically(path, bytes);
}

//! Rebuilds a machine from the checkpoint file `path` (at most 1 GiB); the machine's restore checks
//! the bytes (envelope, checksum, every field).
template <checkpointable Machine>
[[nodiscard]] Machine restore_from_file(const std::string& path) {
  const std::vector<std::byte> bytes = detail::read_file(path, "restore_from_file");
  return Machine::restore(bytes);
}

ULORL_NAMESPACE_END
