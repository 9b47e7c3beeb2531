# ulorl_add_kernel_library(name [MASK type | VALUE_MASKS]): a static library of the policy-loss
# kernels, compiled once for every target that links it instead of in each translation unit that
# calls the loss (one object per (value, mask) pair, so that they build in parallel). The pairs are
# those of include/ulorl/loss/kernel_pairs.hpp (read here: the one list); with MASK, only the pairs
# of that mask type; with VALUE_MASKS, only those whose mask type is the value type. Linking the
# library defines ULORL_EXTERN_KERNELS and ULORL_EXTERN_KERNEL_PAIRS (the library's pairs), so that
# loss/policy_loss.hpp declares exactly those pairs extern. The library property
# ULORL_KERNEL_DEFINITIONS holds the two definitions for sources that use the library's file
# instead of the target. Links ulorl::ulorl where that target exists (else the caller sets the
# include directories). Included by the top-level project, the fuzz project and the installed
# package config (find_package(ulorl) provides the function to consumers).
# ULORL_KERNEL_PAIRS_HEADER: set by the installed package config; else the source tree's header.
if(NOT ULORL_KERNEL_PAIRS_HEADER)
  set(ULORL_KERNEL_PAIRS_HEADER ${CMAKE_CURRENT_LIST_DIR}/../include/ulorl/loss/kernel_pairs.hpp)
endif()
file(READ ${ULORL_KERNEL_PAIRS_HEADER} ULORL_KERNEL_PAIRS_TEXT)
string(REGEX MATCH "// pairs: begin.*// pairs: end" ULORL_KERNEL_PAIRS_TEXT "${ULORL_KERNEL_PAIRS_TEXT}")
string(REGEX MATCHALL "ULORL_PAIR\\([^)]+\\)" ULORL_KERNEL_PAIR_ITEMS "${ULORL_KERNEL_PAIRS_TEXT}")
set(ULORL_KERNEL_PAIRS)
foreach(item IN LISTS ULORL_KERNEL_PAIR_ITEMS)
  string(REGEX REPLACE "^ULORL_PAIR\\(([^,]+), *([^)]+)\\)$" "\\1,\\2" pair "${item}")
  list(APPEND ULORL_KERNEL_PAIRS "${pair}")
endforeach()
if(NOT ULORL_KERNEL_PAIRS)
  message(FATAL_ERROR "ulorl_kernels.cmake: no ULORL_PAIR(value, mask) line in ${ULORL_KERNEL_PAIRS_HEADER}")
endif()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${ULORL_KERNEL_PAIRS_HEADER})

function(ulorl_add_kernel_library name)
  cmake_parse_arguments(arg "VALUE_MASKS" "MASK" "" ${ARGN})
  if(arg_MASK AND arg_VALUE_MASKS)
    message(FATAL_ERROR "ulorl_add_kernel_library(${name}): MASK and VALUE_MASKS exclude each other")
  endif()
  set(tus)
  set(pairs_macro)
  foreach(pair IN LISTS ULORL_KERNEL_PAIRS)
    string(REPLACE "," ";" types "${pair}")
    list(GET types 0 value)
    list(GET types 1 mask)
    if((arg_MASK AND NOT mask STREQUAL arg_MASK) OR (arg_VALUE_MASKS AND NOT mask STREQUAL value))
      continue()
    endif()
    string(MAKE_C_IDENTIFIER ${pair} id)
    set(tu ${CMAKE_CURRENT_BINARY_DIR}/${name}/policy_loss_${id}.cpp)
    file(CONFIGURE OUTPUT ${tu} CONTENT "#include <ulorl/loss/policy_loss.hpp>\nULORL_INSTANTIATE_POLICY_LOSS(${pair})\n")
    list(APPEND tus ${tu})
    string(APPEND pairs_macro "ULORL_PAIR(${pair})")
  endforeach()
  if(NOT tus)
    message(FATAL_ERROR "ulorl_add_kernel_library(${name}): no pair of kernel_pairs.hpp matches")
  endif()
  add_library(${name} STATIC ${tus})
  if(TARGET ulorl::ulorl)
    target_link_libraries(${name} PUBLIC ulorl::ulorl)
  endif()
  set(defs ULORL_EXTERN_KERNELS "ULORL_EXTERN_KERNEL_PAIRS=${pairs_macro}")
  target_compile_definitions(${name} PUBLIC ${defs})
  set_target_properties(${name} PROPERTIES ULORL_KERNEL_DEFINITIONS "${defs}")
endfunction()
