// isa_probe.hpp — one translation unit per instruction set runs the same vectorised kernels
// (policy_loss and logits_forward) and reports the addresses of the instantiations it linked to.
#pragma once

#include <vector>

namespace isa_probe {

struct result {
  const void* policy_loss_fn = nullptr;    //!< &ulorl::policy_loss<float, std::uint8_t> as this TU sees it
  const void* logits_forward_fn = nullptr; //!< &ulorl::logits_forward<float, std::int64_t, float, ...>
  double loss = 0;
  double loss_scale = 0;  //!< sum of |advantage| over the valid tokens / the normaliser: the size of the
                          //!< per-token terms whose float rounding the loss carries (they cancel in it)
  std::vector<float> grad;
  std::vector<float> log_prob, entropy;
};

//! Addresses only (safe on any CPU); `run` also executes the kernels.
result portable(bool run);  // built with the project's default flags
result avx2(bool run);      // built with -mavx2 -mfma

}  // namespace isa_probe
