// ulorl/loss/extern_kernels.hpp — compile the policy-loss kernels once per program instead of once
// per translation unit.
//
// Every translation unit that calls ulorl::policy_loss instantiates the kernels of every objective,
// KL estimator and row form for its value and mask types: the largest part of its compile time.
// A program with many such units can compile them once:
//   - in every unit that calls the loss, include this header (or define ULORL_EXTERN_KERNELS for
//     the whole target: policy_loss.hpp then includes it); it declares the common instantiations
//     `extern`, so those units only call them;
//   - in exactly one unit, instantiate them:
//         #include <ulorl/loss/extern_kernels.hpp>
//         ULORL_INSTANTIATE_POLICY_LOSS(float, float)   // one line per declared (value, mask) pair
//     (one pair per unit builds them in parallel; cmake/ulorl_kernels.cmake does that).
// The declared pairs: value float or double, mask the value type, std::uint8_t or bool (or only
// the mask type ULORL_EXTERN_KERNELS_MASK, where defined; or only float / float and double /
// double, where ULORL_EXTERN_KERNELS_VALUE_MASKS is defined). Any other pair is instantiated where it
// is used, as without this header. The instantiations belong to the
// ISA tag of the units' compiler flags (core/simd.hpp): units built with other instruction-set flags
// (-mavx2, ...) name other functions and instantiate their own. The executor does not matter: the
// dispatch takes an executor_ref (core/parallel.hpp).
#pragma once

#include <cstdint>

#include "ulorl/loss/policy_loss.hpp"

//! The explicit instantiation of policy_loss's dispatch for value type T and mask type M.
#define ULORL_POLICY_LOSS_INSTANCE_(EXTERN, T, M)                                                                  \
  ULORL_NAMESPACE_BEGIN namespace detail {                                                                         \
  inline namespace ULORL_ISA {                                                                                     \
  EXTERN template policy_loss_result policy_loss_dispatch<T, M>(const policy_loss_inputs<T, M>&, token_view<T>,    \
                                                                token_view<T>, const policy_loss_config&,          \
                                                                executor_ref);                                     \
  }                                                                                                                \
  }                                                                                                                \
  ULORL_NAMESPACE_END

//! Instantiates (defines) the kernels of one (value, mask) pair: in one translation unit only.
#define ULORL_INSTANTIATE_POLICY_LOSS(T, M) ULORL_POLICY_LOSS_INSTANCE_(, T, M)
//! Declares the kernels of one (value, mask) pair as instantiated elsewhere.
#define ULORL_EXTERN_POLICY_LOSS(T, M) ULORL_POLICY_LOSS_INSTANCE_(extern, T, M)

//! In a translation unit built with other instruction-set flags (e.g. -mavx2 -mfma): instantiates
//! the kernels of (T, M) for those flags and defines `NAME()` (at global scope: the instantiation
//! opens namespace ulorl), which returns them for
//! ulorl::install_policy_loss_kernel. Call NAME only after the CPU check (its unit's code may use
//! the wider instructions anywhere). Link this unit after the default-flags code (last in the link
//! line): functions that both define outside the ISA-tagged namespaces (the standard library's,
//! ulorl's validation) then keep the default build's copy, which the linker picks first.
#define ULORL_POLICY_LOSS_KERNEL_GETTER(NAME, T, M)                                                 \
  ULORL_INSTANTIATE_POLICY_LOSS(T, M)                                                               \
  ::ulorl::policy_loss_kernel<T, M> NAME() noexcept { return &::ulorl::detail::policy_loss_dispatch<T, M>; }

//! Every pair this header declares (cmake/ulorl_kernels.cmake lists the same pairs): with
//! ULORL_EXTERN_KERNELS_VALUE_MASKS defined, float and double with masks of their own type only;
//! with ULORL_EXTERN_KERNELS_MASK defined (a mask type), float and double with that mask only (e.g.
//! std::uint8_t, the mask type of the torch adapter).
#if defined(ULORL_EXTERN_KERNELS_VALUE_MASKS)
#define ULORL_POLICY_LOSS_COMMON_PAIRS_(X) \
  X(float, float)                          \
  X(double, double)
#elif defined(ULORL_EXTERN_KERNELS_MASK)
#define ULORL_POLICY_LOSS_COMMON_PAIRS_(X) \
  X(float, ULORL_EXTERN_KERNELS_MASK)      \
  X(double, ULORL_EXTERN_KERNELS_MASK)
#else
#define ULORL_POLICY_LOSS_COMMON_PAIRS_(X) \
  X(float, float)                          \
  X(float, std::uint8_t)                   \
  X(float, bool)                           \
  X(double, double)                        \
  X(double, std::uint8_t)                  \
  X(double, bool)
#endif

ULORL_POLICY_LOSS_COMMON_PAIRS_(ULORL_EXTERN_POLICY_LOSS)
