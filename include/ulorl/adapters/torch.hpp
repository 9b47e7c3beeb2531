// ulorl/adapters/torch.hpp — the libtorch adapter (optional: needs libtorch; CMake target
// ulorl::torch, package component `torch`). Everything lives in namespace ulorl::th:
//   tensor_views.hpp  tensors -> ulorl views (dtype, device, rank, shape, stride checks; no copies),
//                     torch_executor (at::parallel_for), torch_gemm (at::mm_out for the linear head)
//   ops.hpp           the `ulorl` torch library: policy_loss, logits_statistics, policy_loss_from_logits,
//                     linear_head_policy_loss, agg_loss, kl_penalty as operators (schemas; CPU, Meta,
//                     Autograd kernels), the th:: functions through them
//   autograd.hpp      policy_loss_from_logits in place as a torch::autograd::Function, and the fused
//                     paths' kernel calls the operators share (exact gradients from ulorl's kernels)
//   advantages.hpp    group_advantages, broadcast_to_tokens, mpt_mask, dynamic_sampling_filter
// Bad input raises ulorl::error (a std::invalid_argument naming function, argument, index and
// value), never c10::Error; see docs/torch.md for the error policy, dtype and stride rules.
#pragma once

#include "ulorl/adapters/torch/advantages.hpp"
#include "ulorl/adapters/torch/autograd.hpp"
#include "ulorl/adapters/torch/ops.hpp"
#include "ulorl/adapters/torch/tensor_views.hpp"
