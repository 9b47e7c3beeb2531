// tests/support/fifo_watchdog.hpp — runs a call that must not block on a FIFO. A reader that opens
// a FIFO nobody writes to waits in open(2) forever; the watchdog thread, if the call has not
// returned within `patience`, opens the FIFO for writing and closes it again, which releases such a
// reader (its open returns, its read sees end of file), and records that it had to. A test then
// checks `fired` is false: it fails, instead of hanging, when the call blocked. Internal linkage
// (anonymous namespace), like the tests' own helpers.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace {

//! Calls `f()`; returns whether the watchdog had to release a reader blocked on the FIFO `fifo`.
template <class F>
bool blocked_on_fifo(const std::string& fifo, F&& f, std::chrono::seconds patience = std::chrono::seconds(20)) {
  std::mutex m;
  std::condition_variable cv;
  bool done = false, fired = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(m);
    while (!done) {
      if (cv.wait_for(lock, patience, [&] { return done; })) break;
      // Opening for writing without blocking succeeds only while a reader has the FIFO open.
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd >= 0) {
        fired = true;
        ::close(fd);
      }
    }
  });
  try {
    f();
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(m);
      done = true;
    }
    cv.notify_all();
    watchdog.join();
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(m);
    done = true;
  }
  cv.notify_all();
  watchdog.join();
  return fired;
}

}  // namespace
