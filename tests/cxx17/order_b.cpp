// The formula headers in another include order (each header includes what it uses).
#include <ulorl/logits/online_softmax.hpp>
#include <ulorl/core/ragged.hpp>
#include <ulorl/loss/metrics.hpp>
#include <ulorl/loss/aggregation.hpp>
#include <ulorl/loss/entropy.hpp>
#include <ulorl/loss/detail/row_sums.hpp>
#include <ulorl/loss/detail/token_loss.hpp>
#include <ulorl/loss/policy_loss_types.hpp>
#include <ulorl/loss/rollout_correction/statistics.hpp>

#if __cplusplus >= 202002L
#error "order_b.cpp must be compiled as C++17"
#endif
