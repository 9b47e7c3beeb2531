// ulorl/adapters/torch.hpp: every autograd function against the same formula written with plain
// torch ops (torch_support.hpp), float64 and float32; float64 gradients against central finite
// differences; a composed graph (linear layer -> logits -> ulorl loss -> weights); advantages, token
// broadcast, MPT masks and the dynamic-sampling filter against plain-torch formulas; bad inputs
// (dtype, device, rank, sizes, strides, labels out of range, NaN) raise ulorl::error naming the
// argument and leave outputs untouched; an undefined mask gives the bits of an all-ones mask (losses,
// metrics, gradients, token broadcast; padded and packed); peak memory of logits_statistics forward + backward against
// torch's own formula. One translation unit: each one that includes the adapter compiles every
// kernel instantiation again.
#include <ulorl/adapters/torch.hpp>
#include <ulorl/presets/nemo_rl.hpp>
#include <ulorl/presets/trl.hpp>
#include <ulorl/presets/verl.hpp>

#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "catch.hpp"
#include "torch_support.hpp"

namespace th = ulorl::th;
using tsupport::close;

namespace {

struct batch {
  at::Tensor lp, old, adv, mask, ref, ent, w;
};

//! [B, T] token tensors: log-probs near old ones (ratios in ~[0.6, 1.6]: both clip sides hit),
//! advantages of both signs, a ragged 0/1 mask with every row non-empty.
batch make_batch(std::int64_t b, std::int64_t t, at::ScalarType dt) {
  const auto o = at::TensorOptions().dtype(dt);
  batch x;
  x.old = -at::rand({b, t}, o) * 3 - 0.05;
  x.lp = x.old + (at::rand({b, t}, o) - 0.5);
  x.ref = x.old + (at::rand({b, t}, o) - 0.5) * 0.4;
  x.adv = at::randn({b, 1}, o).expand({b, t}).contiguous();
  const at::Tensor len = at::randint(1, t + 1, {b, 1});
  x.mask = at::arange(t).unsqueeze(0).lt(len);
  x.ent = at::rand({b, t}, o) * 2;
  x.w = at::rand({b, t}, o) * 0.5 + 0.75;
  return x;
}

ulorl::policy_loss_config full_config(double tokens) {
  ulorl::policy_loss_config cfg;
  cfg.objective.eps_low = 0.2;
  cfg.objective.eps_high = 0.28;
  cfg.kl_coef = 0.05;
  cfg.entropy_coef = 0.01;
  cfg.normalizer = {ulorl::agg_mode::token_mean, tokens, 1.0};
  return cfg;
}

}  // namespace

TEST_CASE("torch policy_loss matches the plain-torch formula (loss and gradients)", "[torch][policy_loss]") {
  tsupport::seed(1001);
  for (auto dt : {at::kDouble, at::kFloat}) {
    const double tol = dt == at::kDouble ? 1e-12 : 2e-5;
    for (auto [b, t] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {3, 47}, {8, 300}}) {
      batch x = make_batch(b, t, dt);
      const double n = x.mask.sum().item<double>();
      const auto cfg = full_config(n);
      at::Tensor lp = x.lp.clone().requires_grad_(), ent = x.ent.clone().requires_grad_();
      th::policy_loss_tensors extra{.ref_log_prob = x.ref, .weights = x.w, .entropy = ent};
      auto out = th::policy_loss(lp, x.old, x.adv, x.mask, cfg, extra);
      REQUIRE(out.loss.dim() == 0);
      REQUIRE(out.loss.scalar_type() == dt);
      (2.5 * out.loss).backward();

      at::Tensor lp2 = x.lp.clone().requires_grad_(), ent2 = x.ent.clone().requires_grad_();
      at::Tensor ref = tsupport::oracle_policy_loss(lp2, x.old, x.adv, x.mask, 0.2, 0.28, x.ref, 0.05, ent2, 0.01, x.w);
      (2.5 * ref).backward();
      CHECK(close(out.loss, ref, tol, tol));
      CHECK(close(lp.grad(), lp2.grad(), tol, tol * 1e-2));
      CHECK(close(ent.grad(), ent2.grad(), tol, tol * 1e-2));
      // Metrics: the ratio mean over valid tokens, as torch computes it.
      const at::Tensor m = x.mask.to(dt);
      const double ratio_mean = ((at::exp(x.lp - x.old) * m).sum() / m.sum()).item<double>();
      CHECK(std::fabs(out.result.metrics.ratio_mean() - ratio_mean) <= tol * 10);
      CHECK(out.result.metrics.tokens == n);
    }
  }
}

TEST_CASE("torch policy_loss: packed layout, uint8 and float masks, strided inputs equal the padded result",
          "[torch][policy_loss]") {
  tsupport::seed(1002);
  batch x = make_batch(5, 33, at::kDouble);
  const auto cfg = full_config(x.mask.sum().item<double>());
  th::policy_loss_tensors extra{.ref_log_prob = x.ref, .weights = x.w, .entropy = x.ent};
  const auto base = th::policy_loss(x.lp, x.old, x.adv, x.mask, cfg, extra);
  // uint8 and float64 masks.
  CHECK(th::policy_loss(x.lp, x.old, x.adv, x.mask.to(at::kByte), cfg, extra).result.loss == base.result.loss);
  CHECK(th::policy_loss(x.lp, x.old, x.adv, x.mask.to(at::kDouble), cfg, extra).result.loss == base.result.loss);
  // Strided: a [B, T] view of a transposed [T, B] tensor (column stride B).
  const at::Tensor lpt = x.lp.t().contiguous().t();
  REQUIRE(lpt.stride(1) == 5);
  CHECK(std::fabs(th::policy_loss(lpt, x.old, x.adv, x.mask, cfg, extra).result.loss - base.result.loss) < 1e-14);
  // Packed: every row's full T tokens, flattened, offsets b * T.
  const at::Tensor off = at::arange(0, 6 * 33, 33, at::TensorOptions().dtype(at::kLong));
  th::policy_loss_tensors pextra{.ref_log_prob = x.ref.reshape({-1}),
                                 .weights = x.w.reshape({-1}),
                                 .entropy = x.ent.reshape({-1}),
                                 .offsets = off};
  at::Tensor lpp = x.lp.reshape({-1}).clone().requires_grad_();
  const auto packed = th::policy_loss(lpp, x.old.reshape({-1}), x.adv.reshape({-1}), x.mask.reshape({-1}), cfg, pextra);
  CHECK(std::fabs(packed.result.loss - base.result.loss) < 1e-14);
  packed.loss.backward();
  CHECK(lpp.grad().sizes() == lpp.sizes());
  // int32 offsets.
  pextra.offsets = off.to(at::kInt);
  CHECK(std::fabs(th::policy_loss(x.lp.reshape({-1}), x.old.reshape({-1}), x.adv.reshape({-1}), x.mask.reshape({-1}),
                                  cfg, pextra)
                      .result.loss -
                  base.result.loss) < 1e-14);
}

TEST_CASE("torch policy_loss with cfg.rollout: the correction inside the loss equals apply() then the loss",
          "[torch][rollout]") {
  tsupport::seed(1013);
  namespace rc = ulorl::rollout_correction;
  for (auto dt : {at::kDouble, at::kFloat}) {
    batch x = make_batch(6, 40, dt);
    const at::Tensor ro = x.old + (at::rand({6, 40}, at::TensorOptions().dtype(dt)) - 0.5) * 0.6;
    rc::config c;  // token TIS, upper 2, and a token k2 rejection
    c.rejection.chain.push_back({rc::rs_statistic::token, rc::rs_estimator::k2, 0.0, 0.02});
    // apply() on views of the tensors: weights and keep-mask, then the loss on them.
    const at::Tensor m8 = x.mask.to(at::kByte);
    const at::Tensor w = at::empty_like(x.old), keep = at::empty_like(m8);
    const auto tv = [](const at::Tensor& t, auto* p) {
      using E = std::remove_pointer_t<decltype(p)>;
      return ulorl::token_view<E>::padded(
          ulorl::matrix_view<E>(p, static_cast<std::size_t>(t.size(0)), static_cast<std::size_t>(t.size(1))));
    };
    rc::statistics st;
    const auto run_apply = [&](auto tag) {
      using T = decltype(tag);
      const rc::inputs<T, std::uint8_t> rin{tv(x.old, x.old.data_ptr<T>()), tv(ro, ro.data_ptr<T>()),
                                            tv(m8, m8.data_ptr<std::uint8_t>())};
      st = rc::apply(rin, rc::outputs<T, std::uint8_t>{tv(w, w.data_ptr<T>()), tv(keep, keep.data_ptr<std::uint8_t>())},
                     c)
               .totals;
    };
    if (dt == at::kDouble)
      run_apply(double{});
    else
      run_apply(float{});
    const double kept = st.tokens - st.rejected_tokens;
    REQUIRE(st.rejected_tokens > 0);
    auto cfg = full_config(kept);
    at::Tensor lp1 = x.lp.clone().requires_grad_(), lp2 = x.lp.clone().requires_grad_();
    const auto a =
        th::policy_loss(lp1, x.old, x.adv, keep, cfg, {.ref_log_prob = x.ref, .weights = w, .entropy = x.ent});
    cfg.rollout = c;
    const auto b = th::policy_loss(lp2, x.old, x.adv, x.mask, cfg,
                                   {.ref_log_prob = x.ref, .entropy = x.ent, .rollout_log_prob = ro});
    a.loss.backward();
    b.loss.backward();
    CHECK(a.result.loss == b.result.loss);
    CHECK(b.result.rollout.rejected_tokens == st.rejected_tokens);
    CHECK(b.result.rollout.k3_sum == st.k3_sum);
    CHECK(at::equal(lp1.grad(), lp2.grad()));
    // Without cfg.rollout, rollout_log_prob is an error naming it.
    cfg.rollout.reset();
    try {
      (void)th::policy_loss(x.lp, x.old, x.adv, x.mask, cfg,
                            {.ref_log_prob = x.ref, .entropy = x.ent, .rollout_log_prob = ro});
      FAIL("no error");
    } catch (const ulorl::error& e) {
      CHECK(e.argument() == "rollout_log_prob");
    }
  }
}

TEST_CASE("torch policy_loss: gradients equal central finite differences (float64)", "[torch][policy_loss][fd]") {
  tsupport::seed(1003);
  batch x = make_batch(3, 7, at::kDouble);
  const auto cfg = full_config(x.mask.sum().item<double>());
  at::Tensor lp = x.lp.clone().requires_grad_(), ent = x.ent.clone().requires_grad_();
  th::policy_loss(lp, x.old, x.adv, x.mask, cfg, {.ref_log_prob = x.ref, .weights = x.w, .entropy = ent})
      .loss.backward();
  at::Tensor lpd = x.lp.clone(), entd = x.ent.clone();
  const auto f = [&] {
    return th::policy_loss(lpd, x.old, x.adv, x.mask, cfg, {.ref_log_prob = x.ref, .weights = x.w, .entropy = entd})
        .result.loss;
  };
  CHECK(tsupport::fd_matches(f, lpd, lp.grad()));
  CHECK(tsupport::fd_matches(f, entd, ent.grad()));
}

TEST_CASE("torch logits_statistics matches log_softmax / gather / entropy (values and gradients)", "[torch][logits]") {
  tsupport::seed(1004);
  for (auto dt : {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf}) {
    // 16-bit statistics are rounded once to their dtype (2^-8 and 2^-11 relative).
    const double tol = dt == at::kDouble ? 1e-12 : dt == at::kBFloat16 ? 8e-3 : dt == at::kHalf ? 1e-3 : 1e-5;
    for (double tau : {1.0, 0.7}) {
      for (auto [n, v] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {3, 47}, {17, 1023}, {4, 3000}}) {
        const at::Tensor base = (at::randn({n, v}, at::kDouble) * 3).to(dt);
        const at::Tensor labels = at::randint(0, v, {n}, at::TensorOptions().dtype(at::kLong));
        const at::Tensor a = at::randn({n}, at::kDouble), c = at::randn({n}, at::kDouble);
        at::Tensor z = base.clone().requires_grad_();
        auto [lp, ent] = th::logits_statistics(z, labels, tau);
        REQUIRE(lp.scalar_type() == dt);
        REQUIRE(ent.scalar_type() == dt);
        (lp.to(at::kDouble) * a + ent.to(at::kDouble) * c).sum().backward();
        // Oracle in float64 on the same (rounded) logit values, with the row gradients as the
        // statistics' dtype carries them back (a and c rounded to 16 bits for 16-bit logits).
        at::Tensor z2 = base.to(at::kDouble).requires_grad_();
        auto [lp2, ent2] = tsupport::oracle_logits_statistics(z2, labels, tau);
        (lp2 * a.to(dt).to(at::kDouble) + ent2 * c.to(dt).to(at::kDouble)).sum().backward();
        CHECK(close(lp, lp2, tol, tol));
        CHECK(close(ent, ent2, tol, tol));
        REQUIRE(z.grad().scalar_type() == dt);
        CHECK(close(z.grad(), z2.grad(), tol, tol * 0.1));
      }
    }
  }
}

TEST_CASE("torch logits_statistics: strided logits, int32 labels, one output used", "[torch][logits]") {
  tsupport::seed(1005);
  const std::int64_t n = 9, v = 130;
  const at::Tensor zt = at::randn({v, n}, at::kDouble);
  at::Tensor z = zt.t();  // [n, v], strides (1, n): read in place
  z.requires_grad_();
  const at::Tensor y = at::randint(0, v, {n}, at::TensorOptions().dtype(at::kInt));
  auto [lp, ent] = th::logits_statistics(z, y);
  ent.sum().backward();  // grad of log_prob undefined
  at::Tensor z2 = zt.t().detach().clone().requires_grad_();
  auto [lp2, ent2] = tsupport::oracle_logits_statistics(z2, y);
  ent2.sum().backward();
  CHECK(close(lp, lp2, 1e-12, 1e-12));
  CHECK(close(z.grad(), z2.grad(), 1e-12, 1e-13));
  at::Tensor z3 = zt.t().detach().clone().requires_grad_();
  th::logits_statistics(z3, y).first.sum().backward();  // grad of entropy undefined
  at::Tensor z4 = zt.t().detach().clone().requires_grad_();
  tsupport::oracle_logits_statistics(z4, y).first.sum().backward();
  CHECK(close(z3.grad(), z4.grad(), 1e-12, 1e-13));
}

TEST_CASE("torch logits_statistics: gradients equal central finite differences (float64)", "[torch][logits][fd]") {
  tsupport::seed(1006);
  const at::Tensor base = at::randn({4, 11}, at::kDouble) * 2;
  const at::Tensor y = at::randint(0, 11, {4}, at::TensorOptions().dtype(at::kLong));
  const at::Tensor a = at::randn({4}, at::kDouble), c = at::randn({4}, at::kDouble);
  at::Tensor z = base.clone().requires_grad_();
  auto [lp, ent] = th::logits_statistics(z, y, 0.8);
  (lp * a + ent * c).sum().backward();
  at::Tensor zd = base.clone();
  const auto f = [&] {
    auto [l, e] = th::logits_statistics(zd, y, 0.8);
    return (l * a + e * c).sum().item<double>();
  };
  CHECK(tsupport::fd_matches(f, zd, z.grad()));
}

TEST_CASE("torch policy_loss_from_logits matches the plain-torch graph (copy and in place)", "[torch][fused]") {
  tsupport::seed(1007);
  for (auto dt : {at::kDouble, at::kFloat}) {
    const double tol = dt == at::kDouble ? 1e-11 : 3e-5;
    for (bool in_place : {false, true}) {
      const std::int64_t b = 3, t = 5, v = 257;
      batch x = make_batch(b, t, dt);
      const double n = x.mask.sum().item<double>();
      auto cfg = full_config(n);
      const at::Tensor zb = at::randn({b * t, v}, at::TensorOptions().dtype(dt)) * 2;
      const at::Tensor y = at::randint(0, v, {b * t}, at::TensorOptions().dtype(at::kLong));
      // ulorl: logits = leaf * 1 (a non-leaf, as a model's output), so in place may overwrite it.
      at::Tensor leaf = zb.clone().requires_grad_();
      at::Tensor z = leaf * 1.0;
      th::logits_loss_config opt{.extra = {.ref_log_prob = x.ref, .weights = x.w}, .in_place = in_place};
      opt.logits.temperature = 0.9;
      auto out = th::policy_loss_from_logits(z, y, x.old, x.adv, x.mask, cfg, opt);
      (3.0 * out.loss).backward();
      // Plain torch.
      at::Tensor leaf2 = zb.clone().requires_grad_();
      auto [lp, ent] = tsupport::oracle_logits_statistics(leaf2, y, 0.9);
      at::Tensor ref = tsupport::oracle_policy_loss(lp.view({b, t}), x.old, x.adv, x.mask, 0.2, 0.28, x.ref, 0.05,
                                                    ent.view({b, t}), 0.01, x.w);
      (3.0 * ref).backward();
      CHECK(close(out.loss, ref, tol, tol));
      CHECK(close(out.log_prob, lp.view({b, t}), tol, tol));
      CHECK(close(leaf.grad(), leaf2.grad(), tol * 10, tol * 1e-2));
    }
  }
}

TEST_CASE("torch composed graph: linear layer -> logits -> ulorl loss -> weight gradients", "[torch][graph]") {
  tsupport::seed(1008);
  const std::int64_t b = 2, t = 6, h = 16, v = 97;
  batch x = make_batch(b, t, at::kDouble);
  const auto cfg = full_config(x.mask.sum().item<double>());
  const at::Tensor hid = at::randn({b * t, h}, at::kDouble);
  const at::Tensor w0 = at::randn({v, h}, at::kDouble) * 0.3, b0 = at::randn({v}, at::kDouble) * 0.1;
  const at::Tensor y = at::randint(0, v, {b * t}, at::TensorOptions().dtype(at::kLong));
  const th::policy_loss_tensors extra{.ref_log_prob = x.ref, .weights = x.w};

  // Plain torch.
  at::Tensor w2 = w0.clone().requires_grad_(), bias2 = b0.clone().requires_grad_();
  auto [lp2, ent2] = tsupport::oracle_logits_statistics(at::addmm(bias2, hid, w2.t()), y);
  tsupport::oracle_policy_loss(lp2.view({b, t}), x.old, x.adv, x.mask, 0.2, 0.28, x.ref, 0.05, ent2.view({b, t}), 0.01,
                               x.w)
      .backward();

  SECTION("logits_statistics + policy_loss") {
    at::Tensor w = w0.clone().requires_grad_(), bias = b0.clone().requires_grad_();
    auto [lp, ent] = th::logits_statistics(at::addmm(bias, hid, w.t()), y);
    th::policy_loss(lp.view({b, t}), x.old, x.adv, x.mask, cfg,
                    {.ref_log_prob = x.ref, .weights = x.w, .entropy = ent.view({b, t})})
        .loss.backward();
    CHECK(close(w.grad(), w2.grad(), 1e-10, 1e-13));
    CHECK(close(bias.grad(), bias2.grad(), 1e-10, 1e-13));
  }
  SECTION("policy_loss_from_logits in place") {
    at::Tensor w = w0.clone().requires_grad_(), bias = b0.clone().requires_grad_();
    th::policy_loss_from_logits(at::addmm(bias, hid, w.t()), y, x.old, x.adv, x.mask, cfg,
                                {.extra = extra, .in_place = true})
        .loss.backward();
    CHECK(close(w.grad(), w2.grad(), 1e-10, 1e-13));
    CHECK(close(bias.grad(), bias2.grad(), 1e-10, 1e-13));
  }
  SECTION("linear_head_policy_loss, chunks of 5 rows") {
    at::Tensor w = w0.clone().requires_grad_(), bias = b0.clone().requires_grad_();
    at::Tensor hg = hid.clone().requires_grad_();
    th::linear_head_loss_config opt{.extra = extra};
    opt.head.chunk_rows = 5;
    auto out = th::linear_head_policy_loss(hg, w, bias, y, x.old, x.adv, x.mask, cfg, opt);
    out.loss.backward();
    CHECK(close(w.grad(), w2.grad(), 1e-10, 1e-13));
    CHECK(close(bias.grad(), bias2.grad(), 1e-10, 1e-13));
    at::Tensor hg2 = hid.clone().requires_grad_();
    auto [l3, e3] = tsupport::oracle_logits_statistics(at::addmm(b0, hg2, w0.t()), y);
    tsupport::oracle_policy_loss(l3.view({b, t}), x.old, x.adv, x.mask, 0.2, 0.28, x.ref, 0.05, e3.view({b, t}), 0.01,
                                 x.w)
        .backward();
    CHECK(close(hg.grad(), hg2.grad(), 1e-10, 1e-13));
  }
}

TEST_CASE("torch linear_head_policy_loss float32 against plain torch", "[torch][head]") {
  tsupport::seed(1009);
  const std::int64_t b = 4, t = 8, h = 64, v = 1000;
  batch x = make_batch(b, t, at::kFloat);
  const auto cfg = full_config(x.mask.sum().item<double>());
  const at::Tensor hid = at::randn({b * t, h}), w0 = at::randn({v, h}) * 0.1;
  const at::Tensor y = at::randint(0, v, {b * t}, at::TensorOptions().dtype(at::kLong));
  at::Tensor w = w0.clone().requires_grad_(), hg = hid.clone().requires_grad_();
  th::linear_head_loss_config opt{.extra = {.ref_log_prob = x.ref, .weights = x.w}};
  opt.head.chunk_rows = 7;
  opt.head.temperature = 1.3;
  auto out = th::linear_head_policy_loss(hg, w, at::Tensor(), y, x.old, x.adv, x.mask, cfg, opt);
  (0.5 * out.loss).backward();
  at::Tensor w2 = w0.clone().requires_grad_(), hg2 = hid.clone().requires_grad_();
  auto [lp, ent] = tsupport::oracle_logits_statistics(at::mm(hg2, w2.t()), y, 1.3);
  at::Tensor ref = tsupport::oracle_policy_loss(lp.view({b, t}), x.old, x.adv, x.mask, 0.2, 0.28, x.ref, 0.05,
                                                ent.view({b, t}), 0.01, x.w);
  (0.5 * ref).backward();
  CHECK(close(out.loss, ref, 1e-4, 1e-5));
  CHECK(close(w.grad(), w2.grad(), 1e-3, 1e-6));
  CHECK(close(hg.grad(), hg2.grad(), 1e-3, 1e-6));
}

TEST_CASE("torch linear_head_policy_loss is the ulorl operator: th:: bits, gradients asked for, Meta shapes",
          "[torch][head][ops]") {
  tsupport::seed(1010);
  const std::int64_t b = 3, t = 5, h = 6, v = 13;
  batch x = make_batch(b, t, at::kDouble);
  const auto cfg = full_config(x.mask.sum().item<double>());
  const at::Tensor hid = at::randn({b * t, h}, at::kDouble), w0 = at::randn({v, h}, at::kDouble) * 0.3;
  const at::Tensor b0 = at::randn({v}, at::kDouble) * 0.1;
  const at::Tensor y = at::randint(0, v, {b * t}, at::TensorOptions().dtype(at::kLong));
  th::linear_head_loss_config opt{.extra = {.ref_log_prob = x.ref, .weights = x.w}};
  opt.head.chunk_rows = 4;
  opt.head.temperature = 0.9;
  using ulorl::th::ops::opt_tensor;
  const std::vector<double> enc = ulorl::encode_fields(cfg);
  const auto& public_op = c10::Dispatcher::singleton()
                              .findSchemaOrThrow("ulorl::linear_head_policy_loss", "")
                              .typed<th::ops::detail::head_loss_sig>();
  const auto& primitive = c10::Dispatcher::singleton()
                              .findSchemaOrThrow("ulorl::_linear_head_policy_loss_forward", "")
                              .typed<th::ops::detail::head_loss_forward_sig>();
  const auto call = [&](const at::Tensor& hh, const at::Tensor& ww, const at::Tensor& bb) {
    return public_op.call(hh, ww, opt_tensor(bb), y, x.old, x.adv, opt_tensor(x.mask), opt_tensor(x.ref),
                          opt_tensor(x.w), opt_tensor(), opt_tensor(), enc, 0.9, true, false, 4, 256 << 20);
  };

  at::Tensor h1 = hid.clone().requires_grad_(), w1 = w0.clone().requires_grad_(), b1 = b0.clone().requires_grad_();
  const auto out = th::linear_head_policy_loss(h1, w1, b1, y, x.old, x.adv, x.mask, cfg, opt);
  out.loss.backward();
  at::Tensor h2 = hid.clone().requires_grad_(), w2 = w0.clone().requires_grad_(), b2 = b0.clone().requires_grad_();
  const auto [loss, result, lp, ent] = call(h2, w2, b2);
  loss.backward();
  CHECK(at::equal(loss, out.loss));
  CHECK(at::equal(lp, out.log_prob));
  CHECK(at::equal(ent, out.entropy));
  CHECK_FALSE((result.requires_grad() || lp.requires_grad() || ent.requires_grad()));
  std::vector<double> encoded(ulorl::encoded_result_size);
  ulorl::encode_result(out.result, encoded);
  CHECK(at::equal(result, at::tensor(encoded, at::kDouble)));
  CHECK(at::equal(h1.grad(), h2.grad()));
  CHECK(at::equal(w1.grad(), w2.grad()));
  CHECK(at::equal(b1.grad(), b2.grad()));

  SECTION("the primitive computes the gradients output_mask asks for; [0] for the others") {
    const auto r =
        primitive.call(hid, w0, opt_tensor(b0), y, x.old, x.adv, opt_tensor(x.mask), opt_tensor(x.ref), opt_tensor(x.w),
                       opt_tensor(), opt_tensor(), enc, 0.9, true, false, 4, 256 << 20, {true, false, true});
    CHECK(at::equal(std::get<0>(r), out.loss));
    CHECK(at::equal(std::get<1>(r), h1.grad()));
    CHECK(std::get<2>(r).sizes() == at::IntArrayRef{0});
    CHECK(at::equal(std::get<3>(r), b1.grad()));
  }
  SECTION("a frozen weight gets no gradient; the others are unchanged") {
    at::Tensor h3 = hid.clone().requires_grad_();
    th::linear_head_policy_loss(h3, w0, b0, y, x.old, x.adv, x.mask, cfg, opt).loss.backward();
    CHECK(at::equal(h3.grad(), h1.grad()));
    CHECK_FALSE(w0.grad().defined());
  }
  SECTION("under inference mode: the CompositeExplicitAutograd kernel, the same values") {
    const c10::InferenceMode guard;
    const auto [l4, r4, lp4, ent4] = call(hid, w0, b0);
    CHECK(at::equal(l4, out.loss));
    CHECK(at::equal(r4, result));
    CHECK(at::equal(lp4, lp));
  }
  SECTION("Meta tensors: the CPU kernel's shapes and dtypes (float32 head, float64 tokens)") {
    for (const bool with_bias : {false, true}) {
      const at::Tensor hf = hid.to(at::kFloat), wf = w0.to(at::kFloat);
      const opt_tensor bf = with_bias ? opt_tensor(b0.to(at::kFloat)) : opt_tensor();
      const auto meta = [](const opt_tensor& o) { return o ? opt_tensor(o->to(at::kMeta)) : o; };
      const auto cpu =
          primitive.call(hf, wf, bf, y, x.old, x.adv, opt_tensor(x.mask), opt_tensor(x.ref), opt_tensor(x.w),
                         opt_tensor(), opt_tensor(), enc, 1.0, true, false, 0, 1 << 20, {true, true, true});
      const auto m = primitive.call(hf.to(at::kMeta), wf.to(at::kMeta), meta(bf), y.to(at::kMeta), x.old.to(at::kMeta),
                                    x.adv.to(at::kMeta), opt_tensor(x.mask.to(at::kMeta)),
                                    opt_tensor(x.ref.to(at::kMeta)), opt_tensor(x.w.to(at::kMeta)), opt_tensor(),
                                    opt_tensor(), enc, 1.0, true, false, 0, 1 << 20, {true, true, true});
      const std::array<at::Tensor, 7> c{std::get<0>(cpu), std::get<1>(cpu), std::get<2>(cpu), std::get<3>(cpu),
                                        std::get<4>(cpu), std::get<5>(cpu), std::get<6>(cpu)};
      const std::array<at::Tensor, 7> mm{std::get<0>(m), std::get<1>(m), std::get<2>(m), std::get<3>(m),
                                         std::get<4>(m), std::get<5>(m), std::get<6>(m)};
      for (std::size_t i = 0; i < c.size(); ++i) {
        INFO("output " << i << " with_bias " << with_bias);
        CHECK(mm[i].is_meta());
        CHECK(mm[i].sizes() == c[i].sizes());
        CHECK(mm[i].strides() == c[i].strides());
        CHECK(mm[i].scalar_type() == c[i].scalar_type());
      }
      CHECK(c[1].scalar_type() == at::kFloat);
      CHECK(c[0].scalar_type() == at::kDouble);
      CHECK(c[3].numel() == (with_bias ? v : 0));
    }
  }
  SECTION("tensors on two devices, a negative chunk_rows: ulorl::error naming the argument") {
    try {
      (void)call(hid, w0.to(at::kMeta), b0);
      FAIL("no error");
    } catch (const ulorl::error& e) {
      CHECK(e.function() == "linear_head_policy_loss");
      CHECK(e.argument() == "weight");
    }
    try {
      (void)public_op.call(hid, w0, opt_tensor(), y, x.old, x.adv, opt_tensor(), opt_tensor(x.ref), opt_tensor(),
                           opt_tensor(), opt_tensor(), enc, 1.0, true, false, -1, 256);
      FAIL("no error");
    } catch (const ulorl::error& e) {
      CHECK(e.argument() == "chunk_rows");
    }
  }
}

TEST_CASE("torch autograd functions: a second backward through a consumed gradient raises ulorl::error",
          "[torch][errors]") {
  batch x = make_batch(2, 3, at::kDouble);
  at::Tensor lp = x.lp.clone().requires_grad_();
  auto out = th::policy_loss(lp, x.old, x.adv, x.mask, full_config(x.mask.sum().item<double>()),
                             {.ref_log_prob = x.ref, .entropy = x.ent});
  out.loss.backward({}, /*retain_graph=*/true);
  CHECK_THROWS_AS(out.loss.backward(), ulorl::error);
}

namespace {

//! Runs f, requires an ulorl::error whose function and argument are as given and whose message
//! contains `part`.
void expect_error(const std::function<void()>& f, const std::string& fn, const std::string& arg,
                  const std::string& part) {
  try {
    f();
  } catch (const ulorl::error& e) {
    INFO(e.what());
    CHECK(e.function() == fn);
    CHECK(e.argument() == arg);
    CHECK(std::string(e.what()).find(part) != std::string::npos);
    return;
  }
  FAIL("no ulorl::error thrown (expected " + fn + " / " + arg + ")");
}

}  // namespace

TEST_CASE("torch group_advantages matches the plain-torch group formula", "[torch][advantages]") {
  tsupport::seed(2001);
  for (auto dt : {at::kDouble, at::kFloat}) {
    const double tol = dt == at::kDouble ? 1e-12 : 1e-5;
    // Ids in any order, groups of 2..6.
    const at::Tensor ids = at::randint(0, 5, {40}, at::TensorOptions().dtype(at::kLong));
    const at::Tensor r = at::randint(0, 2, {40}, at::TensorOptions().dtype(dt)) + at::rand({40}, dt) * 0.1;
    const auto preset = ulorl::presets::verl::grpo_advantage();
    const at::Tensor adv = th::group_advantages(r, ids, preset);
    at::Tensor want = at::zeros_like(r);
    for (std::int64_t g = 0; g < 5; ++g) {
      const at::Tensor m = ids.eq(g);
      if (m.sum().item<std::int64_t>() < 2) continue;  // (singletons: verl's identity rule, not compared here)
      const at::Tensor rg = r.masked_select(m);
      want.masked_scatter_(m, (rg - rg.mean()) / (rg.std() + 1e-6));
    }
    const at::Tensor big = at::bincount(ids).index_select(0, ids).ge(2);
    CHECK(close(adv.masked_select(big), want.masked_select(big), tol, tol));
    // Contiguous groups of 4 (TRL: eps 1e-4), int32 ids give the same as int64.
    const at::Tensor a4 = th::group_advantages(r, std::int64_t{4}, ulorl::presets::trl::advantage().group);
    const at::Tensor rv = r.view({10, 4});
    CHECK(close(a4, ((rv - rv.mean(1, true)) / (rv.std(1, true, true) + 1e-4)).view({-1}), tol, tol));
    CHECK(at::equal(th::group_advantages(r, ids.to(at::kInt), preset), adv));
  }
}

TEST_CASE("torch broadcast_to_tokens, mpt_mask and dynamic_sampling_filter match plain torch", "[torch][advantages]") {
  tsupport::seed(2002);
  const std::int64_t b = 6, t = 9;
  const at::Tensor adv = at::randn({b}, at::kDouble);
  const at::Tensor len = at::randint(1, t + 1, {b, 1});
  const at::Tensor mask = at::arange(t).unsqueeze(0).lt(len);
  // masked placement: a_i m_it, in every mask dtype.
  for (const at::Tensor& m : {mask, mask.to(at::kByte), mask.to(at::kDouble)}) {
    const at::Tensor tok = th::broadcast_to_tokens(adv, m, ulorl::presets::verl::grpo_advantage());
    CHECK(at::equal(tok, adv.unsqueeze(1) * mask.to(at::kDouble)));
  }
  // Packed, every_position (NeMo-RL): a_i everywhere.
  const at::Tensor off = at::cat({at::zeros({1}, at::kLong), len.view({-1}).cumsum(0)});
  const at::Tensor pm = at::ones({off[-1].item<std::int64_t>()}, at::kBool);
  const at::Tensor ptok = th::broadcast_to_tokens(adv, pm, ulorl::presets::nemo_rl::advantage(), off);
  CHECK(at::equal(ptok, at::repeat_interleave(adv, len.view({-1}))));

  // MPT, dynamic, response scope: drop valid tokens of positive responses with p >= tau when the
  // response's mean entropy is below sigma.
  const at::Tensor lp =
      at::log(at::rand({b, t}, at::kDouble) * 0.05 + 0.95 * at::randint(0, 2, {b, t}, at::kDouble) + 1e-3).clamp_max(0);
  const at::Tensor ent = at::rand({b, t}, at::kDouble) * 0.4;
  const at::Tensor reward = at::randint(0, 2, {b}, at::kDouble);
  ulorl::mpt_config cfg;
  auto [keep, st] = th::mpt_mask({.log_prob = lp, .entropy = ent, .mask = mask, .response_score = reward}, cfg);
  const at::Tensor md = mask.to(at::kDouble);
  const at::Tensor row_h = (ent * md).sum(1) / md.sum(1);
  const at::Tensor drop = reward.ge(1).unsqueeze(1) & at::exp(lp).ge(0.99) & row_h.lt(0.2).unsqueeze(1);
  const at::Tensor want = mask & drop.logical_not();
  REQUIRE(keep.scalar_type() == at::kBool);
  CHECK(at::equal(keep, want));
  CHECK(st.masked_tokens == static_cast<std::size_t>((mask & drop).sum().item<std::int64_t>()));

  // Dynamic sampling: groups of 4 with all-equal rewards are dropped.
  const at::Tensor ids = at::arange(12, at::TensorOptions().dtype(at::kLong)).floor_divide(4);
  const at::Tensor acc = at::tensor({1., 1., 1., 1., 0., 1., 0., 0., 0., 0., 0., 0.}, at::kDouble);
  auto [k, res] = th::dynamic_sampling_filter(acc, ids);
  CHECK(at::equal(k, acc.view({3, 4}).std(1).gt(0).repeat_interleave(4)));
  CHECK(res.kept_groups == 1);
}

TEST_CASE("torch adapter: bad inputs raise ulorl::error naming the argument, outputs untouched", "[torch][errors]") {
  const auto o = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor lp = -at::rand({2, 4}, o), adv = at::randn({2, 4}, o), mask = at::ones({2, 4}, at::kBool);
  ulorl::policy_loss_config cfg;
  cfg.normalizer = {ulorl::agg_mode::token_mean, 8.0, 1.0};
  // dtype, device, rank, sizes.
  expect_error([&] { (void)th::policy_loss(lp.to(at::kInt), lp, adv, mask, cfg); }, "policy_loss", "log_prob",
               "dtype Int");
  expect_error([&] { (void)th::policy_loss(lp, lp.to(at::kFloat), adv, mask, cfg); }, "policy_loss", "old_log_prob",
               "dtype Float");
  // An integer mask (the frameworks' attention masks) is read as its 0/1 values; a 2 is named, a complex one refused.
  CHECK(at::equal(th::policy_loss(lp, lp, adv, mask.to(at::kInt), cfg).loss,
                  th::policy_loss(lp, lp, adv, mask, cfg).loss));
  expect_error([&] { (void)th::policy_loss(lp, lp, adv, (mask.to(at::kLong) * 2), cfg); }, "policy_loss", "mask",
               "0 or 1");
  expect_error([&] { (void)th::policy_loss(lp, lp, adv, mask.to(at::kComplexFloat), cfg); }, "policy_loss", "mask",
               "must be bool, an integer or a floating type");
  expect_error(
      [&] {
        (void)th::policy_loss(lp, lp, adv, at::ones({2, 4}, at::TensorOptions().device(at::kMeta)), cfg);
      },
      "policy_loss", "mask", "device meta");
  expect_error([&] { (void)th::policy_loss(lp, lp, adv.view({-1}), mask, cfg); }, "policy_loss", "advantages",
               "rank 1");
  expect_error([&] { (void)th::policy_loss(lp, lp, adv.narrow(1, 0, 3), mask, cfg); }, "policy_loss", "advantages",
               "shape differs");
  // NaN with value checks on names the token.
  at::Tensor bad = lp.clone();
  bad[1][2] = std::nan("");
  expect_error([&] { (void)th::policy_loss(bad, lp, adv, mask, cfg); }, "policy_loss", "log_prob", "[6]");

  // logits_statistics: labels out of range, strided labels, rank, dtype, NaN with the value scan.
  const at::Tensor z = at::randn({3, 5}, o);
  const at::Tensor y = at::tensor({0, 4, 5}, at::kLong);
  expect_error([&] { (void)th::logits_statistics(z, y); }, "logits_forward", "labels", "[2] = 5");
  expect_error([&] { (void)th::logits_statistics(z, at::zeros({6}, at::kLong).slice(0, 0, 6, 2)); },
               "logits_statistics", "labels", "contiguous");
  expect_error([&] { (void)th::logits_statistics(z.view({-1}), y); }, "logits_statistics", "logits", "rank 1");
  expect_error([&] { (void)th::logits_statistics(z.to(at::kInt), y); }, "logits_statistics", "logits", "float16");
  expect_error([&] { (void)th::logits_statistics(z, y.to(at::kFloat)); }, "logits_statistics", "labels",
               "int64 or int32");
  at::Tensor zn = z.clone();
  zn[1][3] = std::nan("");
  expect_error([&] { (void)th::logits_statistics(zn, at::zeros({3}, at::kLong), {.check_values = true}); },
               "logits_forward", "logits", "[8]");

  // policy_loss_from_logits in place: an error leaves the logits as they were; a stride-0
  // (expanded) logits tensor cannot take the gradient in place.
  const at::Tensor old = -at::rand({1, 3}, o), a3 = at::randn({1, 3}, o);
  cfg.normalizer.denominator = 3;
  at::Tensor logits = z.clone();
  at::Tensor old_bad = old.clone();
  old_bad[0][1] = std::nan("");
  expect_error(
      [&] {
        (void)th::policy_loss_from_logits(logits, at::zeros({3}, at::kLong), old_bad, a3, at::ones({1, 3}, at::kBool),
                                          cfg, {.in_place = true});
      },
      "policy_loss", "old_log_prob", "[1]");
  CHECK(at::equal(logits, z));
  expect_error(
      [&] {
        (void)th::policy_loss_from_logits(z[0].expand({3, 5}), at::zeros({3}, at::kLong), old, a3,
                                          at::ones({1, 3}, at::kBool), cfg, {.in_place = true});
      },
      "policy_loss_from_logits", "grad_logits", "overlap");

  // Advantages: strided per-response tensors, bad ids.
  const at::Tensor r = at::rand({8}, o);
  expect_error([&] { (void)th::group_advantages(r.slice(0, 0, 8, 2), std::int64_t{2}); }, "group_advantages", "rewards",
               "contiguous");
  expect_error([&] { (void)th::group_advantages(r, at::full({8}, -1, at::kLong)); }, "group_advantages", "group_ids",
               "must be >= 0");
  expect_error([&] { (void)th::group_advantages(r, std::int64_t{3}); }, "group_advantages", "group_size", "");
  expect_error(
      [&] {
        (void)th::broadcast_to_tokens(r.view({2, 4}), mask);
      },
      "broadcast_to_tokens", "advantages", "rank 2");
}

namespace {

//! Every member of policy_loss_result (its loss parts, loss_metrics, rollout statistics) is a
//! double: the results are equal bit for bit when their bytes are.
bool same_bits(const ulorl::policy_loss_result& a, const ulorl::policy_loss_result& b) {
  if (std::memcmp(&a, &b, sizeof a) == 0) return true;
  std::printf("results differ: loss %.17g / %.17g, tokens %g / %g, sequences %g / %g, ratio_sum %.17g / %.17g\n",
              a.loss, b.loss, a.metrics.tokens, b.metrics.tokens, a.metrics.sequences, b.metrics.sequences,
              a.metrics.ratio_sum, b.metrics.ratio_sum);
  return false;
}

}  // namespace

TEST_CASE("torch losses: an undefined mask gives the bits of an all-ones mask (padded and packed)", "[torch][mask]") {
  tsupport::seed(1015);
  const std::int64_t b = 4, t = 7, h = 8, v = 29;
  // Packed rows of 3, 7, 0 and 5 tokens (an empty row included), taken from the front of each row.
  const std::vector<std::int64_t> lens{3, 7, 0, 5};
  const at::Tensor off = at::tensor({0, 3, 10, 10, 15}, at::kLong);
  const auto pack = [&](const at::Tensor& x) {
    std::vector<at::Tensor> rows;
    for (std::int64_t r = 0; r < b; ++r) rows.push_back(x[r].narrow(0, 0, lens[static_cast<std::size_t>(r)]));
    return at::cat(rows);
  };
  for (auto dt : {at::kDouble, at::kFloat}) {
    const auto o = at::TensorOptions().dtype(dt);
    batch x = make_batch(b, t, dt);
    const at::Tensor ro_padded = x.old + (at::rand({b, t}, o) - 0.5) * 0.6;
    for (bool packed : {false, true}) {
      INFO((dt == at::kDouble ? "float64" : "float32") << (packed ? ", packed" : ", padded"));
      const auto tok = [&](const at::Tensor& y) { return packed ? pack(y) : y; };
      const at::Tensor ones = tok(at::ones({b, t}, at::kBool));
      const at::Tensor old = tok(x.old), adv = tok(x.adv), ro = tok(ro_padded);
      const std::int64_t n = ones.numel();
      const auto cfg = full_config(static_cast<double>(n));
      th::policy_loss_tensors extra{.ref_log_prob = tok(x.ref), .weights = tok(x.w)};
      if (packed) extra.offsets = off;

      // policy_loss: gradients to log_prob and entropy.
      {
        at::Tensor lp1 = tok(x.lp).clone().requires_grad_(), lp2 = tok(x.lp).clone().requires_grad_();
        at::Tensor e1 = tok(x.ent).clone().requires_grad_(), e2 = tok(x.ent).clone().requires_grad_();
        th::policy_loss_tensors x1 = extra, x2 = extra;
        x1.entropy = e1, x2.entropy = e2;
        const auto with = th::policy_loss(lp1, old, adv, ones, cfg, x1);
        const auto without = th::policy_loss(lp2, old, adv, at::Tensor(), cfg, x2);
        with.loss.backward();
        without.loss.backward();
        CHECK(without.result.metrics.tokens == static_cast<double>(n));
        CHECK(same_bits(with.result, without.result));
        CHECK(at::equal(with.loss, without.loss));
        CHECK(at::equal(lp1.grad(), lp2.grad()));
        CHECK(at::equal(e1.grad(), e2.grad()));
      }
      // policy_loss with the rollout correction inside the pass (its keep-mask starts from the mask).
      {
        auto rcfg = cfg;
        rcfg.rollout = ulorl::rollout_correction::config{};
        at::Tensor lp1 = tok(x.lp).clone().requires_grad_(), lp2 = tok(x.lp).clone().requires_grad_();
        th::policy_loss_tensors x1{.ref_log_prob = extra.ref_log_prob,
                                   .entropy = tok(x.ent),
                                   .offsets = extra.offsets,
                                   .rollout_log_prob = ro};
        const auto with = th::policy_loss(lp1, old, adv, ones, rcfg, x1);
        const auto without = th::policy_loss(lp2, old, adv, at::Tensor(), rcfg, x1);
        with.loss.backward();
        without.loss.backward();
        CHECK(without.result.rollout.tokens == static_cast<double>(n));
        CHECK(same_bits(with.result, without.result));
        CHECK(at::equal(lp1.grad(), lp2.grad()));
      }
      // policy_loss_from_logits: the logits' gradient, the computed log-probs and entropies.
      {
        const at::Tensor z = at::randn({n, v}, o) * 2;
        const at::Tensor y = at::randint(0, v, {n}, at::TensorOptions().dtype(at::kLong));
        at::Tensor z1 = z.clone().requires_grad_(), z2 = z.clone().requires_grad_();
        const th::logits_loss_config opt{.extra = extra};
        const auto with = th::policy_loss_from_logits(z1, y, old, adv, ones, cfg, opt);
        const auto without = th::policy_loss_from_logits(z2, y, old, adv, at::Tensor(), cfg, opt);
        with.loss.backward();
        without.loss.backward();
        CHECK(same_bits(with.result, without.result));
        CHECK(at::equal(with.log_prob, without.log_prob));
        CHECK(at::equal(with.entropy, without.entropy));
        CHECK(at::equal(z1.grad(), z2.grad()));
      }
      // linear_head_policy_loss: gradients to hidden, weight and bias, in chunks of 5 rows.
      {
        const at::Tensor hid = at::randn({n, h}, o), w0 = at::randn({v, h}, o) * 0.3, b0 = at::randn({v}, o) * 0.1;
        const at::Tensor y = at::randint(0, v, {n}, at::TensorOptions().dtype(at::kLong));
        th::linear_head_loss_config opt{.extra = extra};
        opt.head.chunk_rows = 5;
        at::Tensor h1 = hid.clone().requires_grad_(), w1 = w0.clone().requires_grad_(),
                   b1 = b0.clone().requires_grad_();
        at::Tensor h2 = hid.clone().requires_grad_(), w2 = w0.clone().requires_grad_(),
                   b2 = b0.clone().requires_grad_();
        const auto with = th::linear_head_policy_loss(h1, w1, b1, y, old, adv, ones, cfg, opt);
        const auto without = th::linear_head_policy_loss(h2, w2, b2, y, old, adv, at::Tensor(), cfg, opt);
        with.loss.backward();
        without.loss.backward();
        CHECK(same_bits(with.result, without.result));
        CHECK(at::equal(with.log_prob, without.log_prob));
        CHECK(at::equal(h1.grad(), h2.grad()));
        CHECK(at::equal(w1.grad(), w2.grad()));
        CHECK(at::equal(b1.grad(), b2.grad()));
      }
    }
  }

  // broadcast_to_tokens: packed, an undefined mask is every token inside the offsets (the verl
  // preset allows the empty row); padded, the mask gives the result's shape and is required.
  const at::Tensor a = at::randn({b}, at::kDouble);
  const auto verl = ulorl::presets::verl::grpo_advantage();
  const at::Tensor pm = at::ones({15}, at::kBool);
  for (const at::Tensor& offsets : {off, off.to(at::kInt)}) {
    const at::Tensor with = th::broadcast_to_tokens(a, pm, verl, offsets);
    const at::Tensor without = th::broadcast_to_tokens(a, at::Tensor(), verl, offsets);
    REQUIRE(without.sizes() == with.sizes());
    CHECK(at::equal(with, without));
    CHECK(at::equal(without, at::repeat_interleave(a, at::tensor(lens, at::kLong))));
  }
  expect_error([&] { (void)th::broadcast_to_tokens(a, at::Tensor(), verl); }, "broadcast_to_tokens", "mask",
               "without offsets");
  expect_error(
      [&] {
        (void)th::broadcast_to_tokens(a, at::Tensor(), verl, at::tensor({0, 3, 2, 4, 5}, at::kLong));
      },
      "broadcast_to_tokens", "offsets", "must not decrease");
}

TEST_CASE("torch logits_statistics peak memory: at most 1/10 of torch's log_softmax / gather / entropy",
          "[torch][memory]") {
  // Counted: bytes of live CPU tensors (a wrapper around torch's CPU allocator) above those alive
  // before the call, during forward + backward, minus the [N, V] gradient of the logits (both
  // paths need it). The logits themselves exist before and are not counted. N = 512 here (the
  // torch path peaks at ~5 [N, V] buffers, 1.6 GB at V = 151936); bench_torch runs N = 4096.
  const std::int64_t n = 512, v = 151936;
  auto& alloc = tsupport::counting_allocator::install();
  tsupport::seed(2004);
  const at::Tensor base = at::randn({n, v}) * 2;
  const at::Tensor y = at::randint(0, v, {n}, at::TensorOptions().dtype(at::kLong));
  const at::Tensor a = at::randn({n}), c = at::randn({n});
  const std::int64_t grad_bytes = n * v * 4;
  const auto extra_peak = [&](bool use_ulorl) {
    at::Tensor z = base.clone().requires_grad_();
    const std::int64_t before = alloc.current.load();
    alloc.reset_peak();
    {
      auto [lp, ent] = use_ulorl ? th::logits_statistics(z, y) : tsupport::oracle_logits_statistics(z, y);
      (lp * a + ent * c).sum().backward();
    }
    REQUIRE(z.grad().defined());
    return alloc.peak.load() - before - grad_bytes;
  };
  const std::int64_t ours = extra_peak(true), theirs = extra_peak(false);
  std::printf("logits_statistics N=%lld V=%lld: extra peak ulorl %.3f MB, torch %.1f MB (%.0fx); [N,V] = %.1f MB\n",
              static_cast<long long>(n), static_cast<long long>(v), static_cast<double>(ours) / 1e6,
              static_cast<double>(theirs) / 1e6, static_cast<double>(theirs) / static_cast<double>(ours > 0 ? ours : 1),
              static_cast<double>(grad_bytes) / 1e6);
  CHECK(ours * 10 <= theirs);
  CHECK(ours < n * 64);  // O(N): a few [N] double vectors
}

TEST_CASE("torch adapter: a defined zero-size optional tensor is present (shape-checked), never absent",
          "[torch][errors][absent]") {
  tsupport::seed(3001);
  const std::int64_t b = 2, t = 4, v = 11, h = 5;
  batch x = make_batch(b, t, at::kDouble);
  const auto cfg = full_config(x.mask.sum().item<double>());
  const at::Tensor empty_rows = at::ones({0, t}, at::kBool), empty_both = at::ones({0, 0}, at::kBool);
  for (const at::Tensor& m : {empty_rows, empty_both, empty_rows.to(at::kDouble)}) {
    expect_error([&] { (void)th::policy_loss(x.lp, x.old, x.adv, m, cfg, {.ref_log_prob = x.ref, .entropy = x.ent}); },
                 "policy_loss", "mask", "shape differs");
  }
  // ref_log_prob is checked even with kl_coef == 0, entropy with entropy_coef == 0.
  auto plain = cfg;
  plain.kl_coef = 0.0, plain.entropy_coef = 0.0;
  const at::Tensor z = at::zeros({0, t}, at::kDouble);
  expect_error([&] { (void)th::policy_loss(x.lp, x.old, x.adv, x.mask, plain, {.ref_log_prob = z}); }, "policy_loss",
               "ref_log_prob", "shape differs");
  expect_error([&] { (void)th::policy_loss(x.lp, x.old, x.adv, x.mask, plain, {.entropy = z}); }, "policy_loss",
               "entropy", "shape differs");
  expect_error([&] { (void)th::policy_loss(x.lp, x.old, x.adv, x.mask, plain, {.weights = z}); }, "policy_loss",
               "weights", "shape differs");
  // The fused paths.
  const at::Tensor logits = at::randn({b * t, v}, at::kDouble);
  const at::Tensor y = at::randint(0, v, {b * t}, at::TensorOptions().dtype(at::kLong));
  expect_error([&] { (void)th::policy_loss_from_logits(logits, y, x.old, x.adv, empty_rows, plain); },
               "policy_loss_from_logits", "mask", "shape differs");
  const at::Tensor hid = at::randn({b * t, h}, at::kDouble), w = at::randn({v, h}, at::kDouble);
  expect_error(
      [&] { (void)th::linear_head_policy_loss(hid, w, at::zeros({0}, at::kDouble), y, x.old, x.adv, x.mask, plain); },
      "linear_head_policy_loss", "bias", "has 0 elements");
  // mpt_mask.
  th::mpt_tensors mt{
      .log_prob = x.lp, .entropy = x.ent, .mask = empty_rows, .response_score = at::ones({b}, at::kDouble)};
  expect_error([&] { (void)th::mpt_mask(mt); }, "mpt_mask", "mask", "shape differs");
  // An undefined mask is still every token valid.
  CHECK(at::equal(th::policy_loss(x.lp, x.old, x.adv, at::Tensor(), plain).loss,
                  th::policy_loss(x.lp, x.old, x.adv, at::ones({b, t}, at::kBool), plain).loss));
}

TEST_CASE("torch autograd functions are differentiable once: differentiating a gradient raises",
          "[torch][errors][double_backward]") {
  tsupport::seed(3002);
  const std::int64_t b = 2, t = 3, v = 7, h = 4;
  batch x = make_batch(b, t, at::kDouble);
  const auto cfg = full_config(x.mask.sum().item<double>());
  const at::Tensor logits0 = at::randn({b * t, v}, at::kDouble);
  const at::Tensor y = at::randint(0, v, {b * t}, at::TensorOptions().dtype(at::kLong));
  const at::Tensor hid0 = at::randn({b * t, h}, at::kDouble), w0 = at::randn({v, h}, at::kDouble) * 0.3;
  auto no_kl = cfg;
  no_kl.kl_coef = 0.0, no_kl.entropy_coef = 0.0;
  struct graph {
    std::string fn;
    std::function<std::pair<at::Tensor, at::Tensor>()> make;  // (loss, the input it is differentiated in)
  };
  const std::vector<graph> graphs{
      {"policy_loss",
       [&] {
         at::Tensor lp = x.lp.clone().requires_grad_();
         return std::pair{
             th::policy_loss(lp, x.old, x.adv, x.mask, cfg, {.ref_log_prob = x.ref, .entropy = x.ent}).loss, lp};
       }},
      {"logits_statistics",
       [&] {
         at::Tensor z = logits0.clone().requires_grad_();
         auto [lp, ent] = th::logits_statistics(z, y);
         return std::pair{lp.sum() + ent.sum(), z};
       }},
      {"policy_loss_from_logits",
       [&] {
         at::Tensor z = logits0.clone().requires_grad_();
         return std::pair{th::policy_loss_from_logits(z, y, x.old, x.adv, x.mask, no_kl).loss, z};
       }},
      {"linear_head_policy_loss", [&] {
         at::Tensor wt = w0.clone().requires_grad_();
         return std::pair{th::linear_head_policy_loss(hid0, wt, at::Tensor(), y, x.old, x.adv, x.mask, no_kl).loss, wt};
       }}};
  for (const auto& g : graphs) {
    INFO(g.fn);
    // Plain backward.
    auto [l0, in0] = g.make();
    const at::Tensor plain = torch::autograd::grad({l0}, {in0})[0];
    CHECK_FALSE(plain.requires_grad());
    // create_graph=True alone: the same gradient, which now requires grad...
    auto [l1, in1] = g.make();
    const at::Tensor once = torch::autograd::grad({l1}, {in1}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    CHECK(once.requires_grad());
    CHECK(at::equal(once.detach(), plain));
    // ...and differentiating it raises, naming the function.
    try {
      once.sum().backward();
      FAIL("no error on double backward");
    } catch (const ulorl::error& e) {
      CHECK(e.function() == g.fn);
      CHECK(std::string(e.what()).find("differentiable once") != std::string::npos);
    }
  }
}

TEST_CASE("torch broadcast_to_tokens: hostile offsets are rejected before the result is allocated",
          "[torch][errors][alloc]") {
  const at::Tensor adv = at::ones({1}, at::kDouble);
  const at::Tensor off =
      at::tensor(std::vector<std::int64_t>{5, std::int64_t{1} << 40}, at::TensorOptions().dtype(at::kLong));
  try {
    (void)th::broadcast_to_tokens(adv, at::Tensor(), ulorl::broadcast_config{}, off);
    FAIL("no error");
  } catch (const ulorl::error& e) {
    CHECK(e.function() == "broadcast_to_tokens");
    CHECK(e.argument() == "offsets");
    CHECK(e.index() == 0);
  }
  const at::Tensor down = at::tensor(std::vector<std::int32_t>{0, 7, 3}, at::TensorOptions().dtype(at::kInt));
  expect_error(
      [&] { (void)th::broadcast_to_tokens(at::ones({2}, at::kDouble), at::Tensor(), ulorl::broadcast_config{}, down); },
      "broadcast_to_tokens", "offsets", "must not decrease");
}

TEST_CASE("torch agg_loss and kl_penalty operators: the core's values and gradients", "[torch][ops]") {
  tsupport::seed(3101);
  const at::Tensor x0 = at::randn({4, 9}, at::kDouble), ref = at::randn({4, 9}, at::kDouble);
  at::Tensor mask = at::rand({4, 9}, at::kDouble) > 0.3;
  mask[2].fill_(false);
  const ulorl::agg_normalizer norm{.mode = ulorl::agg_mode::seq_mean_token_mean, .denominator = 3.0, .scale = 0.5};
  at::Tensor x = x0.clone().requires_grad_();
  const at::Tensor loss = th::agg_loss(x, mask, norm);
  loss.backward();
  // The core on raw views.
  const at::Tensor m8 = mask.to(at::kByte).contiguous();
  std::vector<double> grad(36);
  const auto tok = [](auto* p) { return ulorl::token_view<std::remove_pointer_t<decltype(p)>>::padded({p, 4, 9}); };
  const ulorl::token_view<const double> xv = tok(static_cast<const double*>(x0.data_ptr<double>()));
  const double want =
      ulorl::agg_loss(xv, tok(static_cast<const std::uint8_t*>(m8.data_ptr<std::uint8_t>())), tok(grad.data()), norm);
  CHECK(loss.item<double>() == want);
  CHECK(at::equal(x.grad(), at::tensor(grad, at::kDouble).reshape({4, 9})));
  const ulorl::kl_config kl{.estimator = ulorl::kl_estimator::k3, .output_clamp = 10.0};
  at::Tensor y = x0.clone().requires_grad_();
  const at::Tensor k = th::kl_penalty(y, ref, kl);
  k.sum().backward();
  std::vector<double> kv(36), kg(36);
  ulorl::kl_penalty<double>(xv, tok(static_cast<const double*>(ref.data_ptr<double>())), tok(kv.data()), tok(kg.data()),
                            kl);
  CHECK(at::equal(k, at::tensor(kv, at::kDouble).reshape({4, 9})));
  CHECK(at::equal(y.grad(), at::tensor(kg, at::kDouble).reshape({4, 9})));
  CHECK_THROWS_AS(th::kl_penalty(y, ref.slice(1, 0, 8), kl), ulorl::error);
}
