// ulorl/core/isa_dispatch.hpp — run-time instruction-set dispatch of the compiled kernel bodies, one
// mechanism for every kernel that has one (the policy loss, logits_forward, logits_backward).
//
// A kernel body is `detail::<op>_dispatch<A...>`, a function template over element types only (the
// executor is an executor_ref), declared in an ISA-tagged inline namespace (core/simd.hpp): each
// translation unit compiles it for its own instruction-set flags. The pattern is Highway's export /
// dispatch:
//   - export: a unit built with wider flags (-mavx2 -mfma, ...) defines, at global scope, the getter
//     of its own body for a tag type of the caller's (here `my_avx2`):
//         ULORL_KERNEL_GETTER(my_avx2, policy_loss, float, std::uint8_t)
//     (the getter's code may use the wider instructions: call it only after the CPU check);
//   - install: at start-up, after the CPU check (e.g. __builtin_cpu_supports("avx2")),
//         ulorl::install_kernel_of<my_avx2, ulorl::isa_op::policy_loss, float, std::uint8_t>();
//     routes every call of that op and those element types in the program (every translation unit,
//     whatever its flags) to the installed body; nullptr restores each unit's own;
//   - dispatch: the public entry point asks installed_kernel<Op, A...>() first (one relaxed-cost
//     acquire load) and falls back to its unit's own body.
// Results are the installed body's: bits may differ from another instruction set's in the last
// places (vector widths change the order of partial sums, FMA the rounding). Install before any
// thread calls the op. Link the wider unit after the default-flags code (last in the link line):
// functions both define outside the ISA-tagged namespaces (the standard library's, ulorl's
// validation) then keep the default build's copy, which the linker picks first.
#pragma once

#include <atomic>

#include "ulorl/core/config.hpp"

ULORL_NAMESPACE_BEGIN

//! The ops with run-time instruction-set dispatch: tags whose member `kernel<A...>::type` is the
//! function-pointer type of the op's body for element types A... (a variadic member template
//! specialised for the op's arity, so that a pack expands into it; defined beside each op:
//! loss/policy_loss.hpp, logits/forward.hpp, logits/backward.hpp).
namespace isa_op {
struct policy_loss;
struct logits_forward;
struct logits_backward;
}  // namespace isa_op

//! The body type of op `Op` for element types A....
template <class Op, class... A>
using isa_kernel = typename Op::template kernel<A...>::type;

namespace detail {
template <class Op, class... A>
inline std::atomic<isa_kernel<Op, A...>> installed_kernel_slot{nullptr};
}  // namespace detail

//! Routes every call of op `Op` for element types A... to `kernel` (nullptr: each unit's own body).
template <class Op, class... A>
void install_kernel(isa_kernel<Op, A...> kernel) noexcept {
  detail::installed_kernel_slot<Op, A...>.store(kernel, std::memory_order_release);
}

//! The body installed for op `Op` and element types A..., or nullptr (each unit's own).
template <class Op, class... A>
[[nodiscard]] isa_kernel<Op, A...> installed_kernel() noexcept {
  return detail::installed_kernel_slot<Op, A...>.load(std::memory_order_acquire);
}

//! The body of op `Op` for element types A... that the unit of tag `Isa` compiled (defined there by
//! ULORL_KERNEL_GETTER; call only after the CPU check).
template <class Isa, class Op, class... A>
[[nodiscard]] isa_kernel<Op, A...> kernel_of() noexcept;

//! install_kernel<Op, A...>(kernel_of<Isa, Op, A...>()).
template <class Isa, class Op, class... A>
void install_kernel_of() noexcept {
  install_kernel<Op, A...>(kernel_of<Isa, Op, A...>());
}

ULORL_NAMESPACE_END

//! At global scope of a unit built with other instruction-set flags: defines
//! ulorl::kernel_of<ISA, ulorl::isa_op::OP, types...>, this unit's body of op OP (a name of
//! ulorl::isa_op) for the element types given after it, e.g.
//! `ULORL_KERNEL_GETTER(my_avx2, logits_forward, float, std::int64_t, double)`. Taking the body's
//! address instantiates it with this unit's flags (the unit must not declare it extern: no
//! ULORL_EXTERN_KERNELS).
#define ULORL_KERNEL_GETTER(ISA, OP, ...)                                                                  \
  template <>                                                                                              \
  ::ulorl::isa_kernel<::ulorl::isa_op::OP, __VA_ARGS__>                                                    \
  ::ulorl::kernel_of<ISA, ::ulorl::isa_op::OP, __VA_ARGS__>() noexcept {                                   \
    return &::ulorl::detail::OP##_dispatch<__VA_ARGS__>;                                                   \
  }
