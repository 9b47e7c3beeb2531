// ulorl/kernels/torch_launch.hpp — the boundary between the torch operators' CUDA kernels
// (ulorl/adapters/torch/ops_cuda.hpp: host code, C++20, the host compiler) and the device code
// (torch_launch.cuh: nvcc, C++17). The host side describes a call with plain pointers and calls
// the launchers declared here: the policy loss (policy_loss.cuh) and the logits statistics and
// their backward (logits.cuh); one .cu file of the program includes torch_launch.cuh, which
// defines them. Host-compilable C++17 (it needs the CUDA runtime's headers only).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ulorl/core/config.hpp"
#include "ulorl/loss/policy_loss_types.hpp"

ULORL_NAMESPACE_BEGIN
namespace cuda {

namespace torch_launch {

//! The mask's element type on the device.
enum class mask_type : int {
  none,     //!< no mask: every token of the layout valid
  bytes,    //!< uint8 (or bool) 0 / 1
  float32,  //!< float 0 / 1
};

//! One policy-loss call on float32 token arrays of one layout (ulorl::cuda::policy_loss).
struct policy_loss_call {
  int64_t rows = 0, cols = 0, row_stride = 0;  //!< padded [rows, cols] with row_stride; packed: cols = tokens
  const int64_t* offsets = nullptr;            //!< packed: device [rows + 1]; nullptr: padded
  const float* log_prob = nullptr;
  const float* old_log_prob = nullptr;
  const float* advantages = nullptr;
  const float* ref_log_prob = nullptr;
  const float* weights = nullptr;
  const float* entropy = nullptr;
  const void* mask = nullptr;
  mask_type mask_kind = mask_type::none;
  float* grad_log_prob = nullptr;
  float* grad_entropy = nullptr;
  void* result = nullptr;     //!< one device policy_loss_result (encoded_result_size doubles)
  int64_t* status = nullptr;  //!< optional device int64 (policy_loss_outputs::status)
  const policy_loss_config* config = nullptr;
  void* workspace = nullptr;  //!< nullptr: only workspace_bytes is set
  std::size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
};

//! Launches the loss (or, with call.workspace == nullptr, sets call.workspace_bytes). Defined in
//! torch_launch.cuh.
cudaError_t policy_loss(policy_loss_call& call);

//! The logits' element type on the device.
enum class logits_type : int { float32, float16, bfloat16 };

//! One logits call (ulorl::cuda::logits_forward / logits_backward): `rows` rows of `cols` logits,
//! row r at logits + r * row_stride elements, with one int64 label per row; float32 statistics.
struct logits_call {
  int64_t rows = 0, cols = 0, row_stride = 0;
  const void* logits = nullptr;
  logits_type type = logits_type::float32;
  const int64_t* labels = nullptr;
  float temperature = 1.0f;
  int* bad_label_row = nullptr;  //!< optional device int, 0 on entry: (first out-of-range label's row) + 1
  // forward
  float* log_prob = nullptr;
  float* entropy = nullptr;   //!< may be nullptr
  float* lse = nullptr;       //!< may be nullptr
  void* workspace = nullptr;  //!< nullptr: only workspace_bytes is set
  std::size_t workspace_bytes = 0;
  // backward: grad (the logits' type, [rows, cols] with grad_row_stride) = d loss / d logits of
  // loss = sum_r grad_log_prob[r] log_prob[r] + grad_entropy[r] entropy[r]
  const float* saved_lse = nullptr;
  const float* saved_entropy = nullptr;
  const float* grad_log_prob = nullptr;
  const float* grad_entropy = nullptr;  //!< nullptr: no entropy term
  void* grad = nullptr;
  int64_t grad_row_stride = 0;
  cudaStream_t stream = nullptr;
};

//! The forward statistics (or, with call.workspace == nullptr, sets call.workspace_bytes). Defined
//! in torch_launch.cuh.
cudaError_t logits_forward(logits_call& call);
//! The gradient of the logits from the forward's lse and entropy. Defined in torch_launch.cuh.
cudaError_t logits_backward(const logits_call& call);

}  // namespace torch_launch
}  // namespace cuda
ULORL_NAMESPACE_END
