// loss_isa_probe.hpp — the policy loss's vectorised row kernel built for several instruction sets
// in one program (tests/isa/test_loss_isa.cpp). Each probe translation unit runs policy_loss on
// the caller's data twice: on unit-stride rows (the explicit-SIMD kernel, whose code follows the
// TU's -m flags: 16-byte lanes by default, 32 with AVX2, 64 with AVX-512 mask registers) and on
// the same data interleaved with junk (column stride 2: the generic scalar loop), through
// support/loss_paths.hpp. The data and the comparisons live in the portable TU, so no probe runs
// before the CPU check.
#pragma once

#include <cstddef>
#include <string>

#include "support/loss_paths.hpp"

namespace loss_isa {

using loss_paths::paths;
using loss_paths::problem;
using loss_paths::run_result;

//! Element types of one run: value type x mask type.
enum class types { double_double, double_u8, float_u8, float_float };

//! loss_paths::run_both for the element types `ty`, built with this TU's flags.
paths portable(const problem& p, const ulorl::policy_loss_config& cfg, types ty, bool weights, bool entropy);  // default flags
paths avx2(const problem& p, const ulorl::policy_loss_config& cfg, types ty, bool weights, bool entropy);      // -mavx2 -mfma
paths avx512(const problem& p, const ulorl::policy_loss_config& cfg, types ty, bool weights, bool entropy);    // -mavx512f/bw/dq/vl -mfma

//! ulorl::install_kernel of this TU's two (value, mask) pairs (on), or nullptr (off):
//! every TU's policy_loss of those pairs then runs this TU's kernels.
void install_portable(bool on);
void install_avx2(bool on);
void install_avx512(bool on);

//! The value scan (check_values, the vectorised one-pass scan on unit-stride rows): one bad value
//! (NaN, +inf, -inf; a mask value of 2) in each array the configuration reads, at every position
//! of row 1 (vector part and tail), must throw ulorl::error naming the array and the flat index,
//! with the gradients untouched; the same bad value in an array the configuration does not read
//! (ref_log_prob with kl_coef = 0) must not. `p` needs weights and entropy; cfg is used with its
//! kl_coef and entropy_coef set non-zero. Returns how many cases ran, and the first failure in
//! `failure` ("" if none).
std::size_t scan_portable(const problem& p, const ulorl::policy_loss_config& cfg, types ty, std::string& failure);
std::size_t scan_avx2(const problem& p, const ulorl::policy_loss_config& cfg, types ty, std::string& failure);
std::size_t scan_avx512(const problem& p, const ulorl::policy_loss_config& cfg, types ty, std::string& failure);

}  // namespace loss_isa
