// The checks every A/B case file makes after including the ulorl headers of its side: it is built
// for a side, and that side's ulorl lives in its own ABI namespace.
#pragma once

#include <type_traits>

#if !defined(AB_SIDE)
#error "compile with -DAB_SIDE=new or -DAB_SIDE=old (bench/CMakeLists.txt builds both)"
#endif

// The old side is built with -DULORL_ABI_NAMESPACE=v0_base: a baseline whose headers ignored the
// macro would put its symbols into the new side's namespace, where the linker merges them silently.
static_assert(std::is_same_v<ulorl::policy_loss_config, ulorl::ULORL_ABI_NAMESPACE::policy_loss_config>,
              "ulorl does not declare its API in ulorl::ULORL_ABI_NAMESPACE");
