// cuda_policy_loss — calling ulorl's CUDA policy loss from custom code: a trainer that owns its device
// buffers hands ulorl the logits of one micro-batch, the sampled token ids, the old log-probs, the
// advantages and the response mask, and gets back the loss, its metrics and d loss / d logits (in
// place), computed by one launcher sequence on its stream (forward statistics, policy loss,
// backward) with a workspace it allocates once after asking for its size.
//
// The batch here is 4 responses x 48 tokens over a 32,000-token vocabulary, PPO with clip-higher
// (eps_low 0.2, eps_high 0.28) and the k3 KL term against a reference policy; the step's global
// normaliser counts the valid tokens of the whole step (here: this one micro-batch).
// Usage: cuda_policy_loss   (exits 77 without a CUDA device)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <ulorl/kernels/policy_loss.cuh>

#define CHECK(call)                                                                               \
  do {                                                                                            \
    const cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      return 1;                                                                                   \
    }                                                                                             \
  } while (0)

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cuda_policy_loss: no CUDA device\n");
    return 77;
  }
  namespace uc = ulorl::cuda;
  constexpr std::int64_t rows = 4, cols = 48, vocab = 32000, tokens = rows * cols;

  // What the trainer has on the host (in a real trainer: on the device already).
  std::vector<__nv_bfloat16> logits(tokens * vocab);
  std::vector<std::int64_t> labels(tokens);
  std::vector<float> old_lp(tokens), ref_lp(tokens), adv(tokens), mask(tokens);
  std::uint64_t s = 42;
  auto next = [&s] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(s >> 11) * 0x1.0p-53;
  };
  for (auto& x : logits) x = __float2bfloat16_rn(static_cast<float>(6.0 * next() - 3.0));
  for (std::int64_t i = 0; i < tokens; ++i) {
    labels[i] = static_cast<std::int64_t>(next() * vocab);
    old_lp[i] = static_cast<float>(-10.4 + 0.3 * (next() - 0.5));  // near log(1/V): ratios around 1
    ref_lp[i] = static_cast<float>(-10.4 + 0.3 * (next() - 0.5));
    const std::int64_t b = i / cols, t = i % cols;
    adv[i] = b < 2 ? 1.0f : -1.0f;             // two rewarded responses, two not (GRPO, already computed)
    mask[i] = t < cols - 8 * b ? 1.0f : 0.0f;  // responses of 48, 40, 32 and 24 tokens
  }

  // Device buffers, owned by the caller.
  __nv_bfloat16* d_logits;
  std::int64_t* d_labels;
  float *d_old, *d_ref, *d_adv, *d_mask;
  ulorl::policy_loss_result* d_result;
  std::int64_t* d_status;
  CHECK(cudaMalloc(&d_logits, logits.size() * sizeof(__nv_bfloat16)));
  CHECK(cudaMalloc(&d_labels, tokens * sizeof(std::int64_t)));
  for (float** p : {&d_old, &d_ref, &d_adv, &d_mask}) CHECK(cudaMalloc(p, tokens * sizeof(float)));
  CHECK(cudaMalloc(&d_result, sizeof(ulorl::policy_loss_result)));
  CHECK(cudaMalloc(&d_status, sizeof(std::int64_t)));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  CHECK(cudaMemcpyAsync(d_logits, logits.data(), logits.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice, stream));
  CHECK(cudaMemcpyAsync(d_labels, labels.data(), tokens * sizeof(std::int64_t), cudaMemcpyHostToDevice, stream));
  CHECK(cudaMemcpyAsync(d_old, old_lp.data(), tokens * sizeof(float), cudaMemcpyHostToDevice, stream));
  CHECK(cudaMemcpyAsync(d_ref, ref_lp.data(), tokens * sizeof(float), cudaMemcpyHostToDevice, stream));
  CHECK(cudaMemcpyAsync(d_adv, adv.data(), tokens * sizeof(float), cudaMemcpyHostToDevice, stream));
  CHECK(cudaMemcpyAsync(d_mask, mask.data(), tokens * sizeof(float), cudaMemcpyHostToDevice, stream));

  // The loss configuration and the step's global normaliser (token-mean over the step's valid tokens).
  ulorl::policy_loss_config cfg;
  cfg.objective.eps_low = 0.2, cfg.objective.eps_high = 0.28;
  cfg.kl.estimator = ulorl::kl_estimator::k3;
  cfg.kl_coef = 0.001;
  double valid = 0;
  for (float m : mask) valid += m;
  cfg.normalizer = ulorl::global_normalizer(ulorl::agg_mode::token_mean, {valid, 4.0, 4.0});

  const auto layout = uc::token_layout::padded(rows, cols);
  const uc::policy_loss_inputs<float, float, float> in{nullptr, d_old, d_adv, d_mask, d_ref};
  const uc::logits_loss_outputs<__nv_bfloat16> out{d_logits, vocab, d_result, d_status};  // gradient in place

  // Ask for the workspace, allocate it once, run.
  std::size_t bytes = 0;
  CHECK(uc::policy_loss_from_logits(nullptr, bytes, d_logits, vocab, vocab, d_labels, layout, in, out, cfg));
  void* workspace;
  CHECK(cudaMalloc(&workspace, bytes));
  CHECK(uc::policy_loss_from_logits(workspace, bytes, d_logits, vocab, vocab, d_labels, layout, in, out, cfg, {}, {}, stream));

  ulorl::policy_loss_result r;
  std::int64_t status = 0;
  CHECK(cudaMemcpyAsync(&r, d_result, sizeof(r), cudaMemcpyDeviceToHost, stream));
  CHECK(cudaMemcpyAsync(&status, d_status, sizeof(status), cudaMemcpyDeviceToHost, stream));
  CHECK(cudaStreamSynchronize(stream));
  if (status != 0) {
    std::fprintf(stderr, "cuda_policy_loss: bad input at token %lld\n", static_cast<long long>(status - 1));
    return 1;
  }
  std::printf("workspace %zu bytes for %lld tokens x %lld logits\n", bytes, static_cast<long long>(tokens),
              static_cast<long long>(vocab));
  std::printf("loss %.6f (policy %.6f, KL %.6f)\n", r.loss, r.pg_loss, r.kl_loss);
  std::printf("tokens %.0f in %.0f sequences; clip fraction %.4f (low %.4f, high %.4f); ratio mean %.4f [%.4f, %.4f]\n",
              r.metrics.tokens, r.metrics.sequences, r.metrics.clip_fraction(), r.metrics.clip_low_fraction(),
              r.metrics.clip_high_fraction(), r.metrics.ratio_mean(), r.metrics.ratio_min, r.metrics.ratio_max);
  std::printf("approx KL(old || new) k3 %.3g; KL to the reference %.4f\n", r.metrics.approx_kl_k3_mean(), r.metrics.kl_mean());
  // d loss / d logits is in d_logits now: the trainer's backward continues from it.
  cudaFree(workspace);
  for (void* p : {static_cast<void*>(d_logits), static_cast<void*>(d_labels), static_cast<void*>(d_old), static_cast<void*>(d_ref),
                  static_cast<void*>(d_adv), static_cast<void*>(d_mask), static_cast<void*>(d_result), static_cast<void*>(d_status)})
    cudaFree(p);
  cudaStreamDestroy(stream);
  return 0;
}
