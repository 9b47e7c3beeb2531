// examples/rlvr_demo_model.hpp — the toy world of rlvr_demo: a verifiable task (sort a short
// sequence of digits, then stop), a tiny autoregressive policy (a two-layer tanh MLP in Eigen over
// hand-made context features), batched teacher-forced forward/backward, sampling, and Adam.
// Everything is seeded and deterministic.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace demo {

using mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using vec = Eigen::VectorXf;

//! The task: a prompt of 1..max_digits digits in [0, digits); the correct answer is the digits in
//! ascending order followed by EOS. Reward 1 for exactly that, 0 otherwise (the verifier).
struct task {
  int digits = 5;      // vocabulary: digits 0..digits-1, EOS = digits
  int max_digits = 4;  // prompt length 1..max_digits
  [[nodiscard]] int eos() const { return digits; }
  [[nodiscard]] int vocab() const { return digits + 1; }
  [[nodiscard]] int max_response() const { return max_digits + 2; }  // room for one mistake, then truncation

  std::vector<int> sample_prompt(std::mt19937_64& gen) const {
    const int k = std::uniform_int_distribution<int>(1, max_digits)(gen);
    std::vector<int> p(static_cast<std::size_t>(k));
    for (auto& d : p) d = std::uniform_int_distribution<int>(0, digits - 1)(gen);
    return p;
  }
  [[nodiscard]] std::vector<int> answer(std::vector<int> prompt) const {
    std::sort(prompt.begin(), prompt.end());
    prompt.push_back(eos());
    return prompt;
  }
  [[nodiscard]] double reward(const std::vector<int>& prompt, const std::vector<int>& response) const {
    return response == answer(prompt) ? 1.0 : 0.0;
  }
};

//! Context features for predicting token t of the response: prompt digit counts, counts already
//! emitted, the step index and the previous token (one-hot, BOS at t = 0).
struct featurizer {
  task tk;
  [[nodiscard]] int dim() const { return 2 * tk.digits + tk.max_response() + tk.vocab() + 1; }
  void write(const std::vector<int>& prompt, const std::vector<int>& response, std::size_t t, float* x) const {
    std::fill(x, x + dim(), 0.0f);
    const float scale = 1.0f / static_cast<float>(tk.max_digits);
    for (int d : prompt) x[d] += scale;
    for (std::size_t s = 0; s < t; ++s)
      if (response[s] < tk.digits) x[tk.digits + response[s]] += scale;
    x[2 * tk.digits + static_cast<int>(t)] = 1.0f;
    const int prev = t == 0 ? tk.vocab() : response[t - 1];  // BOS is the last slot
    x[2 * tk.digits + tk.max_response() + prev] = 1.0f;
  }
};

//! logits = W3 tanh(W2 tanh(W1 x + b1) + b2) + b3
struct policy {
  mat w1, w2, w3;
  vec b1, b2, b3;

  policy() = default;
  policy(int in, int hidden, int out, std::mt19937_64& gen) {
    const auto init = [&](mat& w, int rows, int cols) {
      w.resize(rows, cols);
      std::normal_distribution<float> n(0.0f, 1.0f / std::sqrt(static_cast<float>(cols)));
      for (int i = 0; i < w.size(); ++i) w.data()[i] = n(gen);
    };
    init(w1, hidden, in);
    init(w2, hidden, hidden);
    init(w3, out, hidden);
    w3 *= 0.1f;  // start close to uniform
    b1 = vec::Zero(hidden);
    b2 = vec::Zero(hidden);
    b3 = vec::Zero(out);
  }

  //! Activations of a batch of contexts X [N, in], kept for the backward pass.
  struct cache {
    mat x, h1, h2, logits;
  };
  void forward(const mat& x, cache& c) const {
    c.x = x;
    c.h1 = ((x * w1.transpose()).rowwise() + b1.transpose()).array().tanh();
    c.h2 = ((c.h1 * w2.transpose()).rowwise() + b2.transpose()).array().tanh();
    c.logits = (c.h2 * w3.transpose()).rowwise() + b3.transpose();
  }
  //! Parameter gradients from d loss / d logits [N, V].
  void backward(const cache& c, const mat& dlogits, policy& grad) const {
    grad.w3 = dlogits.transpose() * c.h2;
    grad.b3 = dlogits.colwise().sum().transpose();
    mat dh2 = (dlogits * w3).array() * (1.0f - c.h2.array().square());
    grad.w2 = dh2.transpose() * c.h1;
    grad.b2 = dh2.colwise().sum().transpose();
    mat dh1 = (dh2 * w2).array() * (1.0f - c.h1.array().square());
    grad.w1 = dh1.transpose() * c.x;
    grad.b1 = dh1.colwise().sum().transpose();
  }
  template <class F>
  void for_each(policy& o, F&& f) {
    f(w1, o.w1);
    f(w2, o.w2);
    f(w3, o.w3);
    f(b1, o.b1);
    f(b2, o.b2);
    f(b3, o.b3);
  }
};

//! Adam (Kingma & Ba) with bias correction; `reset()` is ProRL's optimizer-state reset.
struct adam {
  double lr = 3e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  policy m, v;
  long long t = 0;
  void reset(const policy& like) {
    m = like;
    v = like;
    m.for_each(v, [](auto& a, auto& b) {
      a.setZero();
      b.setZero();
    });
    t = 0;
  }
  void step(policy& p, policy& g) {
    ++t;
    const float c1 = static_cast<float>(1.0 - std::pow(beta1, static_cast<double>(t)));
    const float c2 = static_cast<float>(1.0 - std::pow(beta2, static_cast<double>(t)));
    const float b1 = static_cast<float>(beta1), b2 = static_cast<float>(beta2);
    const float a = static_cast<float>(lr), e = static_cast<float>(eps);
    auto upd = [&](auto& w, auto& gw, auto& mw, auto& vw) {
      mw = b1 * mw + (1 - b1) * gw;
      vw.array() = b2 * vw.array() + (1 - b2) * gw.array().square();
      w.array() -= a * (mw.array() / c1) / ((vw.array() / c2).sqrt() + e);
    };
    upd(p.w1, g.w1, m.w1, v.w1);
    upd(p.w2, g.w2, m.w2, v.w2);
    upd(p.w3, g.w3, m.w3, v.w3);
    upd(p.b1, g.b1, m.b1, v.b1);
    upd(p.b2, g.b2, m.b2, v.b2);
    upd(p.b3, g.b3, m.b3, v.b3);
  }
};

//! log-softmax of one row of logits, in double.
inline void log_softmax(const float* z, int v, double* out) {
  double mx = z[0];
  for (int j = 1; j < v; ++j) mx = std::max(mx, static_cast<double>(z[j]));
  double s = 0;
  for (int j = 0; j < v; ++j) s += std::exp(z[j] - mx);
  const double lse = mx + std::log(s);
  for (int j = 0; j < v; ++j) out[j] = z[j] - lse;
}

}  // namespace demo
