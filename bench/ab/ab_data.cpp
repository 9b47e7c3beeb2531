// bench/ab/ab_data.cpp — the input arrays both sides of the A/B benchmarks read (compiled once, with
// no ulorl header: the data cannot depend on either version of the library), and the tables of
// cases the sides fill.
#include "ab_common.hpp"

#include "bench_common.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <utility>

namespace ab {
namespace {

template <class T>
struct loss_store {
  bench::aligned_vector<T> lp, old, ref, adv, weights, entropy, grad, grad_entropy;
  bench::aligned_vector<std::uint8_t> mask;
  std::vector<std::int64_t> offsets;
  loss_arrays<T> view;
};

// bench_loss.cpp's generator (same seed, same draws), plus the weights and entropies.
template <class T>
std::unique_ptr<loss_store<T>> make_loss(std::size_t n) {
  auto s = std::make_unique<loss_store<T>>();
  const std::size_t rows = n / loss_row_len;
  for (auto* v : {&s->lp, &s->old, &s->ref, &s->adv, &s->weights, &s->entropy, &s->grad, &s->grad_entropy}) v->resize(n);
  s->mask.resize(n);
  s->offsets.resize(rows + 1);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  for (std::size_t i = 0; i < n; ++i) {
    s->old[i] = static_cast<T>(-4 * u(rng));
    s->lp[i] = static_cast<T>(s->old[i] + (u(rng) - 0.5) * 0.8);
    s->ref[i] = static_cast<T>(s->lp[i] + (u(rng) - 0.5) * 0.5);
    s->adv[i] = static_cast<T>((u(rng) - 0.5) * 2);
    s->mask[i] = (i % loss_row_len) < loss_row_len - (i / loss_row_len) % 1000;  // ragged rows
  }
  std::mt19937_64 rng2(11);
  for (std::size_t i = 0; i < n; ++i) {
    s->weights[i] = static_cast<T>(0.5 + u(rng2));
    s->entropy[i] = static_cast<T>(3 * u(rng2));
  }
  for (std::size_t b = 0; b <= rows; ++b) s->offsets[b] = static_cast<std::int64_t>(b * loss_row_len);
  auto& v = s->view;
  v.rows = rows;
  v.tokens = n;
  v.log_prob = s->lp.data();
  v.old_log_prob = s->old.data();
  v.ref_log_prob = s->ref.data();
  v.advantages = s->adv.data();
  v.weights = s->weights.data();
  v.entropy = s->entropy.data();
  v.mask = s->mask.data();
  v.offsets = s->offsets.data();
  v.grad_log_prob = s->grad.data();
  v.grad_entropy = s->grad_entropy.data();
  for (std::size_t b = 0; b < rows; ++b) {
    std::size_t k = 0;
    for (std::size_t t = 0; t < loss_row_len; ++t) k += s->mask[b * loss_row_len + t];
    v.valid_tokens += static_cast<double>(k);
    v.sequences += k > 0 ? 1.0 : 0.0;
  }
  return s;
}

std::uint16_t to_bf16_bits(float f) {
  const auto u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

constexpr std::size_t logits_response_len = 128;

struct logits_store {
  bench::aligned_vector<float> x, grad, old, ref, adv, buf_lp, buf_ent, buf_glp, buf_gent, buf_lse;
  bench::aligned_vector<std::uint16_t> xb, gradb;
  std::vector<std::int64_t> labels;
  std::vector<double> lse, h, glp, gent, out_lp, out_h, out_lse;
  bench::aligned_vector<std::uint8_t> mask;
  logits_arrays view;
};

std::unique_ptr<logits_store> make_logits(std::size_t rows, std::size_t vocab) {
  auto s = std::make_unique<logits_store>();
  const std::size_t n = rows * vocab;
  s->x.resize(n);
  s->grad.assign(n, 0.0f);
  s->xb.resize(n);
  s->gradb.assign(n, 0);
  // bench_logits.cpp's generator: roughly N(0, 3), a sum of four uniforms in [-3, 3].
  std::uint64_t st = 0x9e3779b97f4a7c15ull;
  for (std::size_t i = 0; i < n; ++i) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    const auto u = [&](int k) { return static_cast<float>((st >> (16 * k)) & 0xffff) / 65535.0f * 6.0f - 3.0f; };
    s->x[i] = u(0) + u(1) + u(2) + u(3);
    s->xb[i] = to_bf16_bits(s->x[i]);
  }
  for (std::size_t r = 0; r < rows; ++r) s->labels.push_back(static_cast<std::int64_t>((r * 7919) % vocab));
  // Exact statistics (float64) of every row.
  s->lse.resize(rows);
  s->h.resize(rows);
  std::vector<double> lp(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* x = s->x.data() + r * vocab;
    const double m = *std::max_element(x, x + vocab);
    double z = 0, zx = 0;
    for (std::size_t j = 0; j < vocab; ++j) {
      const double e = std::exp(static_cast<double>(x[j]) - m);
      z += e, zx += e * static_cast<double>(x[j]);
    }
    s->lse[r] = m + std::log(z);
    s->h[r] = s->lse[r] - zx / z;
    lp[r] = static_cast<double>(x[s->labels[r]]) - s->lse[r];
  }
  s->glp.assign(rows, -1.0 / static_cast<double>(rows));
  s->gent.assign(rows, 0.01);
  s->out_lp.assign(rows, 0);
  s->out_h.assign(rows, 0);
  s->out_lse.assign(rows, 0);
  // Token inputs of the fused loss: responses of 128 tokens, the last r % 16 of response r masked.
  for (auto* v : {&s->old, &s->ref, &s->adv, &s->buf_lp, &s->buf_ent, &s->buf_glp, &s->buf_gent, &s->buf_lse}) v->assign(rows, 0.0f);
  s->mask.resize(rows);
  std::mt19937_64 rng(13);
  std::uniform_real_distribution<double> u(0, 1);
  for (std::size_t i = 0; i < rows; ++i) {
    s->old[i] = static_cast<float>(lp[i] + (u(rng) - 0.5) * 0.8);
    s->ref[i] = static_cast<float>(lp[i] + (u(rng) - 0.5) * 0.5);
    s->adv[i] = static_cast<float>((u(rng) - 0.5) * 2);
    const std::size_t resp = i / logits_response_len, t = i % logits_response_len;
    s->mask[i] = t < logits_response_len - resp % 16;
  }
  auto& v = s->view;
  v.rows = rows;
  v.vocab = vocab;
  v.responses = rows / logits_response_len;
  v.response_len = logits_response_len;
  v.logits = s->x.data();
  v.logits_bf16 = s->xb.data();
  v.grad = s->grad.data();
  v.grad_bf16 = s->gradb.data();
  v.labels = s->labels.data();
  v.lse = s->lse.data();
  v.entropy = s->h.data();
  v.grad_log_prob = s->glp.data();
  v.grad_entropy = s->gent.data();
  v.out_log_prob = s->out_lp.data();
  v.out_entropy = s->out_h.data();
  v.out_lse = s->out_lse.data();
  v.old_log_prob = s->old.data();
  v.ref_log_prob = s->ref.data();
  v.advantages = s->adv.data();
  v.mask = s->mask.data();
  v.buf_log_prob = s->buf_lp.data();
  v.buf_entropy = s->buf_ent.data();
  v.buf_grad_log_prob = s->buf_glp.data();
  v.buf_grad_entropy = s->buf_gent.data();
  v.buf_lse = s->buf_lse.data();
  return s;
}

}  // namespace

template <class T>
const loss_arrays<T>& loss_data(std::size_t tokens) {
  static std::map<std::size_t, std::unique_ptr<loss_store<T>>> cache;
  auto& slot = cache[tokens];
  if (!slot) slot = make_loss<T>(tokens);
  return slot->view;
}
template const loss_arrays<float>& loss_data<float>(std::size_t);
template const loss_arrays<double>& loss_data<double>(std::size_t);

const logits_arrays& logits_data(std::size_t rows, std::size_t vocab) {
  static std::map<std::pair<std::size_t, std::size_t>, std::unique_ptr<logits_store>> cache;
  auto& slot = cache[{rows, vocab}];
  if (!slot) slot = make_logits(rows, vocab);
  return slot->view;
}

namespace {
std::map<std::string, std::vector<side_case>>& tables() {
  static std::map<std::string, std::vector<side_case>> m;
  return m;
}
}  // namespace

void add_case(const std::string& side, side_case c) { tables()[side].push_back(std::move(c)); }
const std::vector<side_case>& cases_of(const std::string& side) { return tables()[side]; }

}  // namespace ab
