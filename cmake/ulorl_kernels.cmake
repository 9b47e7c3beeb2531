# ulorl_add_kernel_library(name): a static library of the policy-loss kernels of the common (value,
# mask) pairs (ulorl/loss/extern_kernels.hpp), one object per pair; linking it defines
# ULORL_EXTERN_KERNELS. Included by the top-level project and the fuzz project; links ulorl::ulorl where
# that target exists (else the caller sets the include directories). Not installed: a build-time helper.
# The pairs extern_kernels.hpp declares (ULORL_POLICY_LOSS_COMMON_PAIRS_): keep the two lists in step.
set(ULORL_KERNEL_PAIRS "float,float" "float,std::uint8_t" "float,bool" "double,double" "double,std::uint8_t" "double,bool")
# ulorl_add_kernel_library(name [MASK type | VALUE_MASKS]): with MASK, only the pairs of that mask
# type (defines ULORL_EXTERN_KERNELS_MASK for the targets that link it); with VALUE_MASKS, only
# float / float and double / double (defines ULORL_EXTERN_KERNELS_VALUE_MASKS).
function(ulorl_add_kernel_library name)
  cmake_parse_arguments(arg "VALUE_MASKS" "MASK" "" ${ARGN})
  set(pairs ${ULORL_KERNEL_PAIRS})
  if(arg_MASK AND arg_VALUE_MASKS)
    message(FATAL_ERROR "ulorl_add_kernel_library(${name}): MASK and VALUE_MASKS exclude each other")
  elseif(arg_MASK)
    set(pairs "float,${arg_MASK}" "double,${arg_MASK}")
  elseif(arg_VALUE_MASKS)
    set(pairs "float,float" "double,double")
  endif()
  set(tus)
  foreach(pair IN LISTS pairs)
    string(MAKE_C_IDENTIFIER ${pair} id)
    set(tu ${CMAKE_CURRENT_BINARY_DIR}/${name}/policy_loss_${id}.cpp)
    file(CONFIGURE OUTPUT ${tu} CONTENT "#include <ulorl/loss/extern_kernels.hpp>\nULORL_INSTANTIATE_POLICY_LOSS(${pair})\n")
    list(APPEND tus ${tu})
  endforeach()
  add_library(${name} STATIC ${tus})
  if(TARGET ulorl::ulorl)
    target_link_libraries(${name} PUBLIC ulorl::ulorl)
  endif()
  target_compile_definitions(${name} PUBLIC ULORL_EXTERN_KERNELS)
  if(arg_MASK)
    target_compile_definitions(${name} PUBLIC ULORL_EXTERN_KERNELS_MASK=${arg_MASK})
  elseif(arg_VALUE_MASKS)
    target_compile_definitions(${name} PUBLIC ULORL_EXTERN_KERNELS_VALUE_MASKS)
  endif()
endfunction()
