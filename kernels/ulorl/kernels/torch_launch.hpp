// ulorl/kernels/torch_launch.hpp — the boundary between the torch operators' CUDA kernels
// (ulorl/adapters/torch/ops_cuda.hpp: host code, C++20, the host compiler) and the device code
// (torch_launch.cuh: nvcc, C++17). The host side describes a call with plain pointers and calls
// the launchers declared here: the policy loss (policy_loss.cuh), the logits statistics and their
// backward (logits.cuh) and the linear head (linear_head.cuh); one .cu file of the program includes
// torch_launch.cuh, which defines them. Host-compilable C++17 (it needs the CUDA toolkit's headers
// only: the runtime's and cuBLAS's).
#pragma once

#include <cublas_v2.h>
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

//! The hidden states' and the weight's element type on the device (linear_head.cuh).
enum class head_type : int { float32, bfloat16 };

//! One linear-head call (ulorl::cuda::policy_loss_from_hidden): hidden [tokens, hidden_size] and
//! weight [vocab, hidden_size], both dense row-major of `type`, one int64 label per token. The token
//! inputs, the layout, the result, the status, the configuration, the workspace and the stream are
//! `loss`'s (its log_prob, entropy and gradients are unused: the call computes them); the
//! statistics it computed are copied to log_prob / entropy (float32 in the layout; nullptr: not).
struct head_call {
  policy_loss_call loss;
  int64_t tokens = 0, hidden_size = 0, vocab = 0;
  const void* hidden = nullptr;
  const void* weight = nullptr;
  head_type type = head_type::float32;
  const int64_t* labels = nullptr;
  float temperature = 1.0f;
  int* bad_label_row = nullptr;  //!< optional device int, 0 on entry: (first out-of-range label's token) + 1
  void* grad_hidden = nullptr;   //!< [tokens, hidden_size] of `type`; nullptr: not computed
  float* grad_weight = nullptr;  //!< [vocab, hidden_size] float32, overwritten; nullptr: not computed
  float* log_prob = nullptr;
  float* entropy = nullptr;
  int64_t chunk_rows = 0;  //!< linear_head_launch_config's: 0 automatic
  std::size_t workspace_budget = std::size_t{1} << 30;
  cublasHandle_t blas = nullptr;  //!< bound to loss.stream for the call (its pointer mode kept)
};

//! Launches the linear head (or, with call.loss.workspace == nullptr, sets
//! call.loss.workspace_bytes). Defined in torch_launch.cuh.
cudaError_t linear_head(head_call& call);

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
