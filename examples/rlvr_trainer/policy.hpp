// policy.hpp — the policy of the example trainer: a small decoder-only transformer (libtorch).
//
// Token embedding, n_layers pre-LayerNorm blocks (causal multi-head self-attention with rotary
// position embeddings, then a GELU MLP, each on a residual), a final LayerNorm and a separate
// unembedding to vocabulary logits. Rotary embeddings (RoPE, Su et al. 2021, GPT-NeoX layout)
// rather than learned absolute positions: attention scores then depend on relative offsets only,
// so a rule learned on short sequences (here: "read the remainder four tokens back") holds at
// positions that training rarely reaches.
//
// Two forward modes over the same weights:
//  * forward(tokens [B, T], attention_mask [B, T]) -> logits [B, T, V]: a padded batch (1 = real
//    token; left or right padding, a token's position is the number of real tokens before it),
//    causal attention restricted to real keys. Training and the recompute of log-probs use it.
//  * prefill(...) + decode(...): the KV-cache path of the decoding engine. prefill runs the full
//    forward on right-padded contexts, stores every layer's rotated keys and values in rows of a
//    kv_cache and returns the next-token logits; decode feeds one new token per row at its position,
//    appends its key/value to the row and attends over the row's cached prefix.
// Parameters are initialised from `seed` alone (normal(0, 0.02), residual projections scaled by
// 1/sqrt(2 n_layers), GPT-2 style), independent of torch's global generator, so two policies with
// the same configuration and seed are identical. The module works in float32 or, after
// `policy->to(torch::kFloat64)`, in float64 (the tests' exactness checks).
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace rlvr {

struct policy_config {
  std::int64_t vocab_size = 22;
  std::int64_t d_model = 128;
  std::int64_t n_heads = 4;
  std::int64_t n_layers = 3;
  std::int64_t d_mlp = 512;
  std::int64_t max_seq = 1028;  //!< longest prompt + response (KV-cache capacity per row)
  double rope_base = 10000.0;
  std::uint64_t seed = 1;
  [[nodiscard]] std::int64_t head_dim() const noexcept { return d_model / n_heads; }
};

//! Keys and values of every layer for `rows` sequences: k[l], v[l] are [rows, heads, max_seq, head_dim].
//! Row r holds one sequence's prefix; positions beyond its length hold stale values that the
//! attention masks never read.
struct kv_cache {
  std::vector<torch::Tensor> k, v;
  [[nodiscard]] std::int64_t rows() const { return k.empty() ? 0 : k.front().size(0); }
  //! Copies the first `tokens` positions of row `from` into row `to` (the engine's compaction).
  void move_row(std::int64_t from, std::int64_t to, std::int64_t tokens) {
    for (std::size_t l = 0; l < k.size(); ++l) {
      k[l][to].narrow(1, 0, tokens).copy_(k[l][from].narrow(1, 0, tokens));
      v[l][to].narrow(1, 0, tokens).copy_(v[l][from].narrow(1, 0, tokens));
    }
  }
};

namespace detail {

// x [B, H, T, hd] rotated by the angles whose cos/sin are [B, 1, T, hd/2] (first half of each head
// pairs with the second half, GPT-NeoX layout).
inline torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const auto half = x.size(-1) / 2;
  const auto x1 = x.narrow(-1, 0, half);
  const auto x2 = x.narrow(-1, half, half);
  return torch::cat({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1);
}

}  // namespace detail

//! One pre-LayerNorm transformer block.
class transformer_block_impl : public torch::nn::Module {
 public:
  explicit transformer_block_impl(const policy_config& c)
      : heads_(c.n_heads), head_dim_(c.head_dim()), scale_(1.0 / std::sqrt(static_cast<double>(c.head_dim()))) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    qkv = register_module("qkv", torch::nn::Linear(c.d_model, 3 * c.d_model));
    proj = register_module("proj", torch::nn::Linear(c.d_model, c.d_model));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    fc1 = register_module("fc1", torch::nn::Linear(c.d_model, c.d_mlp));
    fc2 = register_module("fc2", torch::nn::Linear(c.d_mlp, c.d_model));
  }

  //! Full sequence: x [B, T, d], rope cos/sin [B, 1, T, hd/2], additive mask bias [B, 1, T, T].
  //! When `cache` is given, the rotated keys/values go to rows [row0, row0 + B), positions [0, T).
  torch::Tensor forward_full(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                             const torch::Tensor& bias, torch::Tensor* cache_k, torch::Tensor* cache_v,
                             std::int64_t row0) {
    const auto B = x.size(0), T = x.size(1);
    auto [q, k, v] = project(x, cos, sin);
    if (cache_k != nullptr) {
      cache_k->narrow(0, row0, B).narrow(2, 0, T).copy_(k);
      cache_v->narrow(0, row0, B).narrow(2, 0, T).copy_(v);
    }
    const auto att = torch::softmax(torch::matmul(q, k.transpose(-2, -1)) * scale_ + bias, -1);
    return finish(x, torch::matmul(att, v), B, T);
  }

  //! One token per row: x [b, 1, d] at `positions` [b]; rows [0, b) of the cache hold the prefixes.
  //! The new key/value is written at its position, then the query attends over positions
  //! [0, context) of its row under `bias` [b, 1, 1, context] (0 up to its own position, -inf after).
  torch::Tensor forward_step(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                             const torch::Tensor& rows, const torch::Tensor& positions, const torch::Tensor& bias,
                             torch::Tensor& cache_k, torch::Tensor& cache_v, std::int64_t context) {
    using torch::indexing::Slice;
    const auto b = x.size(0);
    auto [q, k, v] = project(x, cos, sin);
    cache_k.index_put_({rows, Slice(), positions}, k.squeeze(2));
    cache_v.index_put_({rows, Slice(), positions}, v.squeeze(2));
    const auto K = cache_k.narrow(0, 0, b).narrow(2, 0, context);
    const auto V = cache_v.narrow(0, 0, b).narrow(2, 0, context);
    const auto att = torch::softmax(torch::matmul(q, K.transpose(-2, -1)) * scale_ + bias, -1);
    return finish(x, torch::matmul(att, V), b, 1);
  }

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};

 private:
  // Pre-norm q, k, v as [B, H, T, hd], q and k rotated.
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> project(const torch::Tensor& x, const torch::Tensor& cos,
                                                                  const torch::Tensor& sin) {
    const auto B = x.size(0), T = x.size(1);
    const auto parts = qkv(ln1(x)).chunk(3, -1);
    auto heads = [&](const torch::Tensor& t) { return t.reshape({B, T, heads_, head_dim_}).transpose(1, 2); };
    return {detail::apply_rope(heads(parts[0]), cos, sin), detail::apply_rope(heads(parts[1]), cos, sin), heads(parts[2])};
  }
  // Attention output [B, H, T, hd] -> residual + projection, then the MLP on its residual.
  torch::Tensor finish(const torch::Tensor& x, const torch::Tensor& attended, std::int64_t B, std::int64_t T) {
    const auto h = x + proj(attended.transpose(1, 2).reshape({B, T, heads_ * head_dim_}));
    return h + fc2(torch::gelu(fc1(ln2(h))));
  }

  std::int64_t heads_, head_dim_;
  double scale_;
};
TORCH_MODULE_IMPL(transformer_block, transformer_block_impl);

class transformer_policy_impl : public torch::nn::Module {
 public:
  explicit transformer_policy_impl(const policy_config& c) : c_(c) {
    if (c.d_model % c.n_heads != 0 || c.head_dim() % 2 != 0)
      throw std::invalid_argument("transformer_policy: d_model / n_heads must be an even integer");
    if (c.vocab_size < 2 || c.n_layers < 1 || c.max_seq < 1)
      throw std::invalid_argument("transformer_policy: vocab_size >= 2, n_layers >= 1, max_seq >= 1 required");
    tok_emb = register_module("tok_emb", torch::nn::Embedding(c.vocab_size, c.d_model));
    blocks_ = register_module("blocks", torch::nn::ModuleList());
    for (std::int64_t l = 0; l < c.n_layers; ++l) {
      layers_.emplace_back(c);
      blocks_->push_back(layers_.back());
    }
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, c.vocab_size).bias(false)));

    // RoPE angles pos * base^(-2i / hd), kept in float64 (not a buffer: .to(dtype) must not round them).
    const auto half = c.head_dim() / 2;
    const auto inv_freq =
        torch::pow(c.rope_base, -torch::arange(half, torch::kFloat64) * (2.0 / static_cast<double>(c.head_dim())));
    const auto angles = torch::outer(torch::arange(c.max_seq, torch::kFloat64), inv_freq);
    rope_cos_ = angles.cos();
    rope_sin_ = angles.sin();
    initialise(c.seed);
  }

  [[nodiscard]] const policy_config& config() const noexcept { return c_; }
  [[nodiscard]] torch::Dtype dtype() const { return tok_emb->weight.scalar_type(); }
  [[nodiscard]] std::int64_t parameter_count() const {
    std::int64_t n = 0;
    for (const auto& p : parameters()) n += p.numel();
    return n;
  }

  //! Logits [B, T, V] of a padded batch; attention_mask [B, T] is 1 (or true) on real tokens.
  torch::Tensor forward(const torch::Tensor& tokens, const torch::Tensor& attention_mask) {
    return head(hidden(tokens, attention_mask.to(torch::kBool), nullptr, 0));
  }

  //! Prefills `lengths[i]` tokens of row i of the right-padded `tokens` [n, T] into cache rows
  //! [first_row, first_row + n) and returns the logits [n, V] that predict each context's next token.
  torch::Tensor prefill(const torch::Tensor& tokens, const torch::Tensor& lengths, kv_cache& cache,
                        std::int64_t first_row) {
    const auto n = tokens.size(0), T = tokens.size(1);
    if (first_row < 0 || first_row + n > cache.rows())
      throw std::invalid_argument("transformer_policy::prefill: rows outside the cache");
    const auto mask = torch::arange(T, torch::kInt64).unsqueeze(0) < lengths.unsqueeze(1);
    const auto h = hidden(tokens, mask, &cache, first_row);
    const auto last = h.index({torch::arange(n, torch::kInt64), lengths - 1});
    return head(last);
  }

  //! One decode iteration: tokens [b] at positions [b] (each row's current length) for cache rows
  //! [0, b); `context` = max(positions) + 1. Returns the next-token logits [b, V].
  torch::Tensor decode(const torch::Tensor& tokens, const torch::Tensor& positions, kv_cache& cache,
                       std::int64_t context) {
    const auto b = tokens.size(0);
    if (b > cache.rows()) throw std::invalid_argument("transformer_policy::decode: more rows than the cache holds");
    if (context > c_.max_seq) throw std::invalid_argument("transformer_policy::decode: context exceeds max_seq");
    auto x = tok_emb(tokens).unsqueeze(1);  // [b, 1, d]
    const auto half = c_.head_dim() / 2;
    const auto cos = rope_cos_.index_select(0, positions).to(x.scalar_type()).view({b, 1, 1, half});
    const auto sin = rope_sin_.index_select(0, positions).to(x.scalar_type()).view({b, 1, 1, half});
    const auto allowed = torch::arange(context, torch::kInt64).unsqueeze(0) <= positions.unsqueeze(1);  // [b, ctx]
    const auto bias = torch::zeros({b, 1, 1, context}, x.options())
                          .masked_fill(allowed.logical_not().view({b, 1, 1, context}), -INFINITY);
    const auto rows = torch::arange(b, torch::kInt64);
    for (std::size_t l = 0; l < layers_.size(); ++l)
      x = layers_[l]->forward_step(x, cos, sin, rows, positions, bias, cache.k[l], cache.v[l], context);
    return head(ln_f(x)).squeeze(1);
  }

  //! A zeroed cache of `rows` rows in the module's dtype.
  [[nodiscard]] kv_cache make_cache(std::int64_t rows) const {
    kv_cache cache;
    const auto opts = torch::TensorOptions().dtype(dtype());
    for (std::int64_t l = 0; l < c_.n_layers; ++l) {
      cache.k.push_back(torch::zeros({rows, c_.n_heads, c_.max_seq, c_.head_dim()}, opts));
      cache.v.push_back(torch::zeros({rows, c_.n_heads, c_.max_seq, c_.head_dim()}, opts));
    }
    return cache;
  }

  torch::nn::Embedding tok_emb{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};

 private:
  // Final-LayerNorm hidden states [B, T, d] of a padded batch (mask: bool [B, T]).
  torch::Tensor hidden(const torch::Tensor& tokens, const torch::Tensor& mask, kv_cache* cache, std::int64_t row0) {
    if (tokens.dim() != 2 || mask.sizes() != tokens.sizes())
      throw std::invalid_argument("transformer_policy: tokens and attention_mask must both be [B, T]");
    const auto B = tokens.size(0), T = tokens.size(1);
    if (T > c_.max_seq)
      throw std::invalid_argument("transformer_policy: sequence of " + std::to_string(T) + " tokens exceeds max_seq " +
                                  std::to_string(c_.max_seq));
    auto x = tok_emb(tokens);
    const auto half = c_.head_dim() / 2;
    const auto positions = (mask.to(torch::kInt64).cumsum(1) - 1).clamp_min(0);  // [B, T]
    const auto cos = rope_cos_.index_select(0, positions.reshape({-1})).to(x.scalar_type()).view({B, 1, T, half});
    const auto sin = rope_sin_.index_select(0, positions.reshape({-1})).to(x.scalar_type()).view({B, 1, T, half});
    // Causal, real keys only; the diagonal stays allowed so that a padded query row is finite.
    const auto causal = torch::ones({T, T}, torch::kBool).tril();
    const auto eye = torch::eye(T, torch::TensorOptions().dtype(torch::kBool));
    const auto allowed = causal & (mask.view({B, 1, 1, T}) | eye);
    const auto bias = torch::zeros({B, 1, T, T}, x.options()).masked_fill(allowed.logical_not(), -INFINITY);
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      torch::Tensor* ck = cache != nullptr ? &cache->k[l] : nullptr;
      torch::Tensor* cv = cache != nullptr ? &cache->v[l] : nullptr;
      x = layers_[l]->forward_full(x, cos, sin, bias, ck, cv, row0);
    }
    return ln_f(x);
  }

  void initialise(std::uint64_t seed) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c_.n_layers));
    torch::NoGradGuard no_grad;
    for (auto& item : named_parameters()) {
      const std::string& name = item.key();
      auto& p = item.value();
      const bool is_norm = name.find("ln") != std::string::npos;
      if (name.ends_with(".bias")) p.zero_();
      else if (is_norm) p.fill_(1.0);
      else if (name.ends_with("proj.weight") || name.ends_with("fc2.weight")) p.normal_(0.0, residual_std, gen);
      else p.normal_(0.0, 0.02, gen);
    }
  }

  policy_config c_;
  torch::nn::ModuleList blocks_{nullptr};
  std::vector<transformer_block> layers_;
  torch::Tensor rope_cos_, rope_sin_;  // [max_seq, hd / 2], float64
};
TORCH_MODULE_IMPL(transformer_policy, transformer_policy_impl);

//! Copies of every parameter (a weight version the trainer or a test can return to).
[[nodiscard]] inline std::vector<torch::Tensor> snapshot_parameters(const transformer_policy& policy) {
  std::vector<torch::Tensor> out;
  for (const auto& p : policy->parameters()) out.push_back(p.detach().clone());
  return out;
}

//! Loads a snapshot taken by snapshot_parameters from a policy of the same configuration.
inline void load_parameters(transformer_policy& policy, const std::vector<torch::Tensor>& snapshot) {
  torch::NoGradGuard no_grad;
  auto params = policy->parameters();
  if (params.size() != snapshot.size()) throw std::invalid_argument("load_parameters: snapshot of another architecture");
  for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(snapshot[i]);
}

}  // namespace rlvr
