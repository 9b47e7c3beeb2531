// tests/support/torch_counting_allocator.hpp — a counting wrapper around libtorch's CPU allocator:
// bytes of live CPU tensors now and at their peak. Shared by the torch adapter's tests
// (tests/torch/) and its benchmark (bench/bench_torch.cpp), which measure peak memory with it.
#pragma once

#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

// torch 2.3 made Allocator::allocate non-const and added the pure virtual copy_data (checked here
// against Debian's 1.13 and 2.6).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define ULORL_TEST_ALLOCATE_CONST
#define ULORL_TEST_ALLOCATOR_COPY_DATA 1
#else
#define ULORL_TEST_ALLOCATE_CONST const
#define ULORL_TEST_ALLOCATOR_COPY_DATA 0
#endif

namespace testing_support {

//! Wraps torch's CPU allocator and counts the bytes of live tensors (current and peak).
struct counting_allocator final : c10::Allocator {
  c10::Allocator* base = nullptr;
  mutable std::atomic<std::int64_t> current{0};
  mutable std::atomic<std::int64_t> peak{0};

  struct ctx_t {
    c10::DataPtr inner;
    std::int64_t bytes;
    const counting_allocator* owner;
  };
  static void release(void* p) {
    auto* c = static_cast<ctx_t*>(p);
    c->owner->current -= c->bytes;
    delete c;
  }
  c10::DataPtr allocate(std::size_t n) ULORL_TEST_ALLOCATE_CONST override {
    c10::DataPtr inner = base->allocate(n);
    void* data = inner.get();
    const c10::Device dev = inner.device();
    auto* c = new ctx_t{std::move(inner), static_cast<std::int64_t>(n), this};
    const std::int64_t now = current += static_cast<std::int64_t>(n);
    std::int64_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
    return {data, c, &release, dev};
  }
#if ULORL_TEST_ALLOCATOR_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#endif
  void reset_peak() const { peak = current.load(); }

  //! Installs the counter as torch's CPU allocator (once per process).
  static counting_allocator& install() {
    static counting_allocator* a = [] {
      auto* c = new counting_allocator;
      c->base = c10::GetCPUAllocator();
      c10::SetCPUAllocator(c, 200);
      return c;
    }();
    return *a;
  }
};

}  // namespace testing_support
