// ulorl/logits.hpp — the logits area: fused CPU kernels from logits [N, V] to the chosen token's
// log-prob, the entropy and the log-sum-exp (one pass), and back to d loss / d logits (one pass).
// policy_loss_from_logits composes them with the loss area. CUDA versions live in
// <ulorl/kernels/logits.cuh> (component ulorl::cuda), never included here.
#pragma once

#include "ulorl/logits/backward.hpp"
#include "ulorl/logits/bf16.hpp"
#include "ulorl/logits/f16.hpp"
#include "ulorl/logits/forward.hpp"
#include "ulorl/logits/fused_loss.hpp"
#include "ulorl/logits/linear_head.hpp"
#include "ulorl/logits/online_softmax.hpp"
#include "ulorl/core/parallel.hpp"
#include "ulorl/logits/simd.hpp"
