// Tests of the controllers' checkpoints (ulorl/control/checkpoint.hpp): every single-bit flip, every
// truncation and an appended byte of a checkpoint of each controller are rejected; payloads built by
// hand from the layout in docs/checkpoints.md, each with a valid checksum and one field out of its
// documented range or one invariant broken, are rejected naming that field; counters at their
// limits make the call that would pass them fail and leave the state unchanged; pinned checkpoints
// of each controller (hexadecimal in this file) are what save() gives and restore() reads back.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <ulorl/control/checkpoint.hpp>
#include <ulorl/control/entropy_controller.hpp>
#include <ulorl/control/kl_controller.hpp>
#include <ulorl/control/reference_reset.hpp>

#include "catch.hpp"
#include "support/golden_bytes.hpp"
#include "support/rejection.hpp"

namespace {

//! Every single-bit flip, every truncation and one appended byte of a checkpoint must be rejected
//! with an error from `fn`; returns how many of those corruptions restored without complaint.
template <class Machine>
std::size_t corruptions_accepted(const std::vector<std::byte>& bytes, std::string_view fn) {
  std::size_t accepted = 0, wrong_function = 0, tried = 0;
  auto attempt = [&](const std::vector<std::byte>& bad) {
    ++tried;
    try {
      (void)Machine::restore(bad);
      ++accepted;
    } catch (const ulorl::error& e) {
      if (e.function() != fn) ++wrong_function;
    }
  };
  for (std::size_t bit = 0; bit < bytes.size() * 8; ++bit) {
    auto bad = bytes;
    bad[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
    attempt(bad);
  }
  for (std::size_t n = 0; n < bytes.size(); ++n)
    attempt(std::vector<std::byte>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n)));
  auto longer = bytes;
  longer.push_back(std::byte{0});
  attempt(longer);
  INFO(tried << " corruptions of a " << bytes.size() << "-byte checkpoint: " << accepted << " accepted, "
             << wrong_function << " rejected by another function");
  CHECK(wrong_function == 0);
  return accepted;
}

}  // namespace

TEST_CASE("KL controller: every bit flip and truncation of a checkpoint is rejected", "[control][checkpoint][kl]") {
  ulorl::kl_controller a({.type = ulorl::kl_control_type::adaptive, .init_coef = 0.05, .target_kl = 0.08,
                          .horizon = 2000, .min_coef = 1e-4, .max_coef = 2.0});
  a.update(0.1, 256);
  a.update(0.03, 512);
  CHECK(corruptions_accepted<ulorl::kl_controller>(a.save(), "kl_controller::restore") == 0);
  ulorl::kl_controller f({.type = ulorl::kl_control_type::fixed, .init_coef = 0.02});
  f.update(0.5, 3);
  CHECK(corruptions_accepted<ulorl::kl_controller>(f.save(), "kl_controller::restore") == 0);
}

TEST_CASE("entropy controller: every bit flip and truncation of a checkpoint is rejected",
          "[control][checkpoint][entropy]") {
  ulorl::entropy_controller a({.rule = ulorl::entropy_control_rule::proportional, .target_entropy = 0.3,
                               .init_coef = 0.01, .tolerance = 0.02, .min_coef = 0.001, .max_coef = 0.05});
  a.update(0.1);
  a.update(0.5);
  CHECK(corruptions_accepted<ulorl::entropy_controller>(a.save(), "entropy_controller::restore") == 0);
  ulorl::entropy_controller s;
  CHECK(corruptions_accepted<ulorl::entropy_controller>(s.save(), "entropy_controller::restore") == 0);
}

TEST_CASE("reference reset: every bit flip and truncation of a checkpoint is rejected", "[control][checkpoint][reset]") {
  ulorl::reference_reset_policy a({.every_n_steps = 7, .patience = 2, .on_drop = true, .max_drop = 0.1,
                                   .on_kl_share = true, .kl_share_patience = 2, .cooldown_steps = 3});
  a.observe_step(1, 0.9, 0.1);
  a.observe_validation(1, 0.4);
  a.observe_validation(2, 0.4);
  a.observe_step(3, 0.9, 0.1);  // kl_share reset
  a.observe_validation(4, 0.35);
  CHECK(a.state().resets == 1);
  CHECK(corruptions_accepted<ulorl::reference_reset_policy>(a.save(), "reference_reset_policy::restore") == 0);
  ulorl::reference_reset_policy fresh;
  CHECK(corruptions_accepted<ulorl::reference_reset_policy>(fresh.save(), "reference_reset_policy::restore") == 0);
}

// ---- payloads built by hand ------------------------------------------------------------------------
namespace {

constexpr double qnan = std::numeric_limits<double>::quiet_NaN();
constexpr double inf = std::numeric_limits<double>::infinity();
constexpr std::int64_t i64_max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t i64_min = std::numeric_limits<std::int64_t>::min();
constexpr std::uint64_t two_63 = std::uint64_t{1} << 63;

// Field by field as docs/checkpoints.md lists them (booleans as a u8, so that 2 can be written).
struct kl_raw {
  std::uint8_t type = 1;
  double init_coef = 0.05, target_kl = 0.08, horizon = 2000, max_error = 0.2, min_coef = 1e-4, max_coef = 2.0;
  double coef = 0.06;
  std::uint64_t updates = 2;
  double last_kl = 0.03, last_error = -0.2;
};
struct entropy_raw {
  std::uint8_t rule = 1;
  double target_entropy = 0.3, init_coef = 0.01, step_up = 0.005, step_down = 0.005, gain = 0.05, tolerance = 0.02,
         min_coef = 0.001, max_coef = 0.05;
  std::uint8_t gate = 1, gate_source = 0, raise_at_target = 0;
  double coef = 0.02;
  std::uint64_t updates = 2;
  double last_entropy = 0.5;
};
// The state of the run in "reference reset: every bit flip ..." above, worked out by hand:
// step 1 (share 0.9 > 0.5: 1 over), validation 1 (0.4: first best), validation 2 (0.4: 1 stale),
// step 3 (2 over >= patience 2: kl_share reset {3, kl_share, 0.9, 1}, counters to 0),
// validation 4 (0.35: 1 stale, a drop of 0.05 <= 0.1).
struct reset_raw {
  std::int64_t every_n_steps = 7;
  std::uint8_t on_plateau = 1;
  std::int64_t patience = 2;
  double min_delta = 0.0;
  std::uint8_t higher_is_better = 1, on_drop = 1;
  double max_drop = 0.1;
  std::uint8_t on_kl_share = 1;
  double max_kl_share = 0.5;
  std::int64_t kl_share_patience = 2, cooldown_steps = 3;
  std::uint8_t manual_ignores_cooldown = 0, reset_optimizer = 1;
  std::uint8_t has_step = 1;
  std::int64_t last_step = 4, anchor_step = 3;
  std::uint8_t has_reset = 1, has_best = 1;
  double best = 0.4;
  std::int64_t evals_without_improvement = 1, kl_over_steps = 0;
  std::uint64_t evaluations = 3, resets = 1;
  std::int64_t event_step = 3;
  std::uint8_t event_trigger = 4;
  double event_value = 0.9;
  std::uint64_t event_index = 1;
};

std::vector<std::byte> encode(const kl_raw& r, std::size_t drop_tail = 0, bool extra = false) {
  std::vector<std::byte> out;
  const auto at = ulorl::detail::begin_checkpoint(out, ulorl::checkpoint_kind::kl_controller, 1);
  ulorl::detail::byte_writer w(out);
  w.u8(r.type);
  for (double v : {r.init_coef, r.target_kl, r.horizon, r.max_error, r.min_coef, r.max_coef, r.coef}) w.f64(v);
  w.u64(r.updates);
  w.f64(r.last_kl);
  w.f64(r.last_error);
  out.resize(out.size() - drop_tail);
  if (extra) w.u8(0);
  ulorl::detail::finish_checkpoint(out, at);
  return out;
}
std::vector<std::byte> encode(const entropy_raw& r, std::size_t drop_tail = 0, bool extra = false) {
  std::vector<std::byte> out;
  const auto at = ulorl::detail::begin_checkpoint(out, ulorl::checkpoint_kind::entropy_controller, 2);
  ulorl::detail::byte_writer w(out);
  w.u8(r.rule);
  for (double v : {r.target_entropy, r.init_coef, r.step_up, r.step_down, r.gain, r.tolerance, r.min_coef, r.max_coef})
    w.f64(v);
  w.u8(r.gate);
  w.u8(r.gate_source);
  w.u8(r.raise_at_target);
  w.f64(r.coef);
  w.u64(r.updates);
  w.f64(r.last_entropy);
  out.resize(out.size() - drop_tail);
  if (extra) w.u8(0);
  ulorl::detail::finish_checkpoint(out, at);
  return out;
}
std::vector<std::byte> encode(const reset_raw& r, std::size_t drop_tail = 0, bool extra = false) {
  std::vector<std::byte> out;
  const auto at = ulorl::detail::begin_checkpoint(out, ulorl::checkpoint_kind::reference_reset, 1);
  ulorl::detail::byte_writer w(out);
  w.i64(r.every_n_steps);
  w.u8(r.on_plateau);
  w.i64(r.patience);
  w.f64(r.min_delta);
  w.u8(r.higher_is_better);
  w.u8(r.on_drop);
  w.f64(r.max_drop);
  w.u8(r.on_kl_share);
  w.f64(r.max_kl_share);
  w.i64(r.kl_share_patience);
  w.i64(r.cooldown_steps);
  w.u8(r.manual_ignores_cooldown);
  w.u8(r.reset_optimizer);
  w.u8(r.has_step);
  w.i64(r.last_step);
  w.i64(r.anchor_step);
  w.u8(r.has_reset);
  w.u8(r.has_best);
  w.f64(r.best);
  w.i64(r.evals_without_improvement);
  w.i64(r.kl_over_steps);
  w.u64(r.evaluations);
  w.u64(r.resets);
  w.i64(r.event_step);
  w.u8(r.event_trigger);
  w.f64(r.event_value);
  w.u64(r.event_index);
  out.resize(out.size() - drop_tail);
  if (extra) w.u8(0);
  ulorl::detail::finish_checkpoint(out, at);
  return out;
}

template <class Raw>
struct mutation {
  std::string what;      //!< the change, for the report
  std::string argument;  //!< the argument the error must name
  std::function<void(Raw&)> apply;
};

//! `base` restores; each mutation of it is rejected by `fn`, naming `argument`.
template <class Machine, class Raw>
void require_each_rejected(const Raw& base, const std::vector<mutation<Raw>>& ms, std::string_view fn) {
  REQUIRE_NOTHROW(Machine::restore(encode(base)));
  for (const auto& m : ms) {
    INFO(fn << ": " << m.what);
    Raw r = base;
    m.apply(r);
    try {
      (void)Machine::restore(encode(r));
      FAIL_CHECK("accepted");
    } catch (const ulorl::error& e) {
      INFO(e.what());
      CHECK(e.function() == fn);
      CHECK(e.argument() == m.argument);
    }
  }
}

}  // namespace

TEST_CASE("KL controller: each field out of range in a checksummed payload is rejected", "[control][checkpoint][kl]") {
  // The hand-built base is the layout save() writes.
  ulorl::kl_controller a({.type = ulorl::kl_control_type::adaptive, .init_coef = 0.05, .target_kl = 0.08,
                          .horizon = 2000, .min_coef = 1e-4, .max_coef = 2.0});
  a.update(0.1, 256);
  kl_raw real;
  real.coef = a.state().coef;
  real.updates = 1;
  real.last_kl = 0.1;
  real.last_error = a.state().last_error;
  CHECK(encode(real) == a.save());

  using M = mutation<kl_raw>;
  const std::vector<M> ms = {
      {"type 2", "type", [](kl_raw& r) { r.type = 2; }},
      {"type 255", "type", [](kl_raw& r) { r.type = 255; }},
      {"init_coef -1", "init_coef", [](kl_raw& r) { r.init_coef = -1; }},
      {"init_coef NaN", "init_coef", [](kl_raw& r) { r.init_coef = qnan; }},
      {"init_coef above max_coef", "init_coef", [](kl_raw& r) { r.init_coef = 3.0; }},
      {"target_kl 0", "target_kl", [](kl_raw& r) { r.target_kl = 0; }},
      {"target_kl NaN", "target_kl", [](kl_raw& r) { r.target_kl = qnan; }},
      {"horizon 1e-310", "horizon", [](kl_raw& r) { r.horizon = 1e-310; }},
      {"horizon inf", "horizon", [](kl_raw& r) { r.horizon = inf; }},
      {"max_error 0", "max_error", [](kl_raw& r) { r.max_error = 0; }},
      {"max_error 1.5", "max_error", [](kl_raw& r) { r.max_error = 1.5; }},
      {"min_coef -0.1", "min_coef", [](kl_raw& r) { r.min_coef = -0.1; }},
      {"min_coef NaN", "min_coef", [](kl_raw& r) { r.min_coef = qnan; }},
      {"max_coef inf", "max_coef", [](kl_raw& r) { r.max_coef = inf; }},
      {"max_coef 2e6", "max_coef", [](kl_raw& r) { r.max_coef = 2e6; }},
      {"max_coef below min_coef", "max_coef", [](kl_raw& r) { r.max_coef = 1e-5; }},
      {"coef NaN", "state.coef", [](kl_raw& r) { r.coef = qnan; }},
      {"coef inf", "state.coef", [](kl_raw& r) { r.coef = inf; }},
      {"coef above max_coef", "state.coef", [](kl_raw& r) { r.coef = 2.5; }},
      {"coef below min_coef", "state.coef", [](kl_raw& r) { r.coef = 1e-5; }},
      {"updates 2^63", "state.updates", [](kl_raw& r) { r.updates = two_63; }},
      {"updates 2^64 - 1", "state.updates", [](kl_raw& r) { r.updates = ~std::uint64_t{0}; }},
      {"last_kl NaN", "state.last_kl", [](kl_raw& r) { r.last_kl = qnan; }},
      {"last_kl -inf", "state.last_kl", [](kl_raw& r) { r.last_kl = -inf; }},
      {"last_error 0.3 beyond max_error", "state.last_error", [](kl_raw& r) { r.last_error = 0.3; }},
      {"last_error NaN", "state.last_error", [](kl_raw& r) { r.last_error = qnan; }},
      {"no update yet but coef != init_coef", "state.coef", [](kl_raw& r) { r.updates = 0; }},
      {"no update yet but last_kl != 0", "state.last_kl",
       [](kl_raw& r) { r.updates = 0, r.coef = r.init_coef, r.last_error = 0.0; }},
      {"no update yet but last_error != 0", "state.last_error",
       [](kl_raw& r) { r.updates = 0, r.coef = r.init_coef, r.last_kl = 0.0; }},
      {"fixed but coef != init_coef", "state.coef", [](kl_raw& r) { r.type = 0; }},
      {"fixed but last_error != 0", "state.last_error", [](kl_raw& r) { r.type = 0, r.coef = r.init_coef; }},
  };
  require_each_rejected<ulorl::kl_controller>(kl_raw{}, ms, "kl_controller::restore");

  // A payload one field short or one byte long, with a valid checksum.
  CHECK_THROWS_WITH(ulorl::kl_controller::restore(encode(kl_raw{}, 8)), Catch::Contains("state.last_error"));
  CHECK_THROWS_WITH(ulorl::kl_controller::restore(encode(kl_raw{}, 0, true)), Catch::Contains("trailing bytes"));
}

TEST_CASE("entropy controller: each field out of range in a checksummed payload is rejected",
          "[control][checkpoint][entropy]") {
  ulorl::entropy_controller a({.rule = ulorl::entropy_control_rule::proportional, .target_entropy = 0.3,
                               .init_coef = 0.01, .tolerance = 0.02, .min_coef = 0.001, .max_coef = 0.05});
  a.update(0.5);  // 0.3 - 0.5 = -0.2 below -0.02: c = 0.01 + 0.05 * -0.2 = 0.0 -> clamped at 0.001
  entropy_raw real;
  real.coef = 0.001;
  real.updates = 1;
  CHECK(encode(real) == a.save());

  using M = mutation<entropy_raw>;
  const std::vector<M> ms = {
      {"rule 2", "rule", [](entropy_raw& r) { r.rule = 2; }},
      {"rule 255", "rule", [](entropy_raw& r) { r.rule = 255; }},
      {"target_entropy -0.1", "target_entropy", [](entropy_raw& r) { r.target_entropy = -0.1; }},
      {"target_entropy 2e6", "target_entropy", [](entropy_raw& r) { r.target_entropy = 2e6; }},
      {"target_entropy NaN", "target_entropy", [](entropy_raw& r) { r.target_entropy = qnan; }},
      {"init_coef beyond 1e6", "init_coef", [](entropy_raw& r) { r.init_coef = 2e6; }},
      {"init_coef NaN", "init_coef", [](entropy_raw& r) { r.init_coef = qnan; }},
      {"step_up -1", "step_up", [](entropy_raw& r) { r.step_up = -1; }},
      {"step_down inf", "step_down", [](entropy_raw& r) { r.step_down = inf; }},
      {"gain 2e6", "gain", [](entropy_raw& r) { r.gain = 2e6; }},
      {"tolerance NaN", "tolerance", [](entropy_raw& r) { r.tolerance = qnan; }},
      {"min_coef -1", "min_coef", [](entropy_raw& r) { r.min_coef = -1; }},
      {"max_coef inf", "max_coef", [](entropy_raw& r) { r.max_coef = inf; }},
      {"max_coef 2e6", "max_coef", [](entropy_raw& r) { r.max_coef = 2e6; }},
      {"max_coef below min_coef", "max_coef", [](entropy_raw& r) { r.max_coef = 0.0005; }},
      {"gate_above_target 2", "bytes", [](entropy_raw& r) { r.gate = 2; }},
      {"gate_source 2", "gate_source", [](entropy_raw& r) { r.gate_source = 2; }},
      {"raise_at_target 2", "bytes", [](entropy_raw& r) { r.raise_at_target = 2; }},
      {"coef NaN", "state.coef", [](entropy_raw& r) { r.coef = qnan; }},
      {"coef above max_coef", "state.coef", [](entropy_raw& r) { r.coef = 0.06; }},
      {"coef below min_coef", "state.coef", [](entropy_raw& r) { r.coef = 0.0; }},
      {"updates 2^63", "state.updates", [](entropy_raw& r) { r.updates = two_63; }},
      {"last_entropy NaN", "state.last_entropy", [](entropy_raw& r) { r.last_entropy = qnan; }},
      {"last_entropy 2e6", "state.last_entropy", [](entropy_raw& r) { r.last_entropy = 2e6; }},
      {"no update yet but coef != init_coef", "state.coef", [](entropy_raw& r) { r.updates = 0; }},
      {"no update yet but last_entropy != 0", "state.last_entropy",
       [](entropy_raw& r) { r.updates = 0, r.coef = r.init_coef; }},
  };
  require_each_rejected<ulorl::entropy_controller>(entropy_raw{}, ms, "entropy_controller::restore");
  CHECK_THROWS_WITH(ulorl::entropy_controller::restore(encode(entropy_raw{}, 8)), Catch::Contains("state.last_entropy"));
  CHECK_THROWS_WITH(ulorl::entropy_controller::restore(encode(entropy_raw{}, 0, true)), Catch::Contains("trailing bytes"));
}

TEST_CASE("reference reset: each field out of range in a checksummed payload is rejected",
          "[control][checkpoint][reset]") {
  ulorl::reference_reset_policy a({.every_n_steps = 7, .patience = 2, .on_drop = true, .max_drop = 0.1,
                                   .on_kl_share = true, .kl_share_patience = 2, .cooldown_steps = 3});
  a.observe_step(1, 0.9, 0.1);
  a.observe_validation(1, 0.4);
  a.observe_validation(2, 0.4);
  a.observe_step(3, 0.9, 0.1);
  a.observe_validation(4, 0.35);
  CHECK(encode(reset_raw{}) == a.save());

  using M = mutation<reset_raw>;
  const std::vector<M> ms = {
      {"every_n_steps -1", "every_n_steps", [](reset_raw& r) { r.every_n_steps = -1; }},
      {"on_plateau 2", "bytes", [](reset_raw& r) { r.on_plateau = 2; }},
      {"patience 0", "patience", [](reset_raw& r) { r.patience = 0; }},
      {"patience INT64_MIN", "patience", [](reset_raw& r) { r.patience = i64_min; }},
      {"min_delta NaN", "min_delta", [](reset_raw& r) { r.min_delta = qnan; }},
      {"higher_is_better 7", "bytes", [](reset_raw& r) { r.higher_is_better = 7; }},
      {"max_drop -1", "max_drop", [](reset_raw& r) { r.max_drop = -1; }},
      {"max_kl_share 1", "max_kl_share", [](reset_raw& r) { r.max_kl_share = 1.0; }},
      {"kl_share_patience 0", "kl_share_patience", [](reset_raw& r) { r.kl_share_patience = 0; }},
      {"cooldown_steps -1", "cooldown_steps", [](reset_raw& r) { r.cooldown_steps = -1; }},
      {"reset_optimizer 2", "bytes", [](reset_raw& r) { r.reset_optimizer = 2; }},
      {"has_step 0 after calls", "state.last_step", [](reset_raw& r) { r.has_step = 0; }},
      {"last_step -1", "state.last_step", [](reset_raw& r) { r.last_step = -1; }},
      {"last_step before the anchor", "state.anchor_step", [](reset_raw& r) { r.last_step = 2; }},
      {"anchor_step -1", "state.anchor_step", [](reset_raw& r) { r.anchor_step = -1; }},
      {"anchor_step off the last reset", "state.last_event.step", [](reset_raw& r) { r.anchor_step = 2; }},
      {"has_reset 0 with resets 1", "state.has_reset", [](reset_raw& r) { r.has_reset = 0; }},
      {"has_best 0 with evaluations 3", "state.has_best", [](reset_raw& r) { r.has_best = 0; }},
      {"best NaN", "state.best", [](reset_raw& r) { r.best = qnan; }},
      {"evals_without_improvement -1", "state.evals_without_improvement",
       [](reset_raw& r) { r.evals_without_improvement = -1; }},
      {"evals_without_improvement INT64_MAX", "state.evals_without_improvement",
       [](reset_raw& r) { r.evals_without_improvement = i64_max; }},
      {"evals_without_improvement == evaluations", "state.evals_without_improvement",
       [](reset_raw& r) { r.evals_without_improvement = 3; }},
      {"kl_over_steps -1", "state.kl_over_steps", [](reset_raw& r) { r.kl_over_steps = -1; }},
      {"kl_over_steps 1 with the trigger off", "state.kl_over_steps",
       [](reset_raw& r) { r.on_kl_share = 0, r.kl_over_steps = 1, r.event_trigger = 5, r.event_value = 0.0; }},
      {"evaluations 2^63", "state.evaluations", [](reset_raw& r) { r.evaluations = two_63; }},
      {"evaluations 0 with a best", "state.has_best", [](reset_raw& r) { r.evaluations = 0; }},
      {"resets 2^64 - 4, index 1", "state.resets", [](reset_raw& r) { r.resets = ~std::uint64_t{0} - 3; }},
      {"resets 2 with index 1", "state.last_event.index", [](reset_raw& r) { r.resets = 2; }},
      {"last_event.step INT64_MIN", "state.last_event.step", [](reset_raw& r) { r.event_step = i64_min; }},
      {"last_event.trigger 6", "state.last_event.trigger", [](reset_raw& r) { r.event_trigger = 6; }},
      {"last_event.trigger 255", "state.last_event.trigger", [](reset_raw& r) { r.event_trigger = 255; }},
      {"last_event.trigger none after a reset", "state.last_event.trigger", [](reset_raw& r) { r.event_trigger = 0; }},
      {"periodic reset recording 0.9 steps", "state.last_event.value", [](reset_raw& r) { r.event_trigger = 1; }},
      {"periodic reset with the trigger off", "state.last_event.trigger",
       [](reset_raw& r) { r.every_n_steps = 0, r.event_trigger = 1, r.event_value = 3.0; }},
      {"periodic reset recording more steps than its step", "state.last_event.value",
       [](reset_raw& r) { r.every_n_steps = 2, r.event_trigger = 1, r.event_value = 4.0; }},
      {"plateau reset with the trigger off", "state.last_event.trigger",
       [](reset_raw& r) { r.on_plateau = 0, r.event_trigger = 2; }},
      {"drop reset with the trigger off", "state.last_event.trigger",
       [](reset_raw& r) { r.on_drop = 0, r.event_trigger = 3; }},
      {"kl_share reset with the trigger off", "state.last_event.trigger", [](reset_raw& r) { r.on_kl_share = 0; }},
      {"kl_share reset recording a share of 0.4", "state.last_event.value", [](reset_raw& r) { r.event_value = 0.4; }},
      {"manual reset recording 0.9", "state.last_event.value", [](reset_raw& r) { r.event_trigger = 5; }},
      {"last_event.value NaN", "state.last_event.value", [](reset_raw& r) { r.event_value = qnan; }},
      {"last_event.index 0", "state.last_event.index", [](reset_raw& r) { r.event_index = 0; }},
  };
  require_each_rejected<ulorl::reference_reset_policy>(reset_raw{}, ms, "reference_reset_policy::restore");

  // The initial state, and what must hold before any call or reset.
  reset_raw fresh{.has_step = 0, .last_step = 0, .anchor_step = 0, .has_reset = 0, .has_best = 0, .best = 0.0,
                  .evals_without_improvement = 0, .kl_over_steps = 0, .evaluations = 0, .resets = 0,
                  .event_step = -1, .event_trigger = 0, .event_value = 0.0, .event_index = 0};
  CHECK(encode(fresh) == ulorl::reference_reset_policy({.every_n_steps = 7, .patience = 2, .on_drop = true,
                                                         .max_drop = 0.1, .on_kl_share = true,
                                                         .kl_share_patience = 2, .cooldown_steps = 3})
                             .save());
  const std::vector<M> fresh_ms = {
      {"last_step 5 before any call", "state.last_step", [](reset_raw& r) { r.last_step = 5; }},
      {"kl_over_steps 1 before any call", "state.kl_over_steps", [](reset_raw& r) { r.kl_over_steps = 1; }},
      {"anchor_step 0 but last_step -1", "state.last_step", [](reset_raw& r) { r.last_step = -1; }},
      {"last_event.step 0 before a reset", "state.last_event.step", [](reset_raw& r) { r.event_step = 0; }},
      {"last_event.trigger manual before a reset", "state.last_event.trigger", [](reset_raw& r) { r.event_trigger = 5; }},
      {"last_event.trigger 6 before a reset", "state.last_event.trigger", [](reset_raw& r) { r.event_trigger = 6; }},
      {"last_event.value 1 before a reset", "state.last_event.value", [](reset_raw& r) { r.event_value = 1.0; }},
      {"last_event.index 1 before a reset", "state.last_event.index", [](reset_raw& r) { r.event_index = 1; }},
      {"best 1 before a validation", "state.best", [](reset_raw& r) { r.best = 1.0; }},
      {"evals_without_improvement 1 before a validation", "state.evals_without_improvement",
       [](reset_raw& r) { r.evals_without_improvement = 1; }},
      {"anchor_step 2 without a reset", "state.anchor_step",
       [](reset_raw& r) { r.has_step = 1, r.last_step = 4, r.anchor_step = 2; }},
  };
  require_each_rejected<ulorl::reference_reset_policy>(fresh, fresh_ms, "reference_reset_policy::restore");
  CHECK_THROWS_WITH(ulorl::reference_reset_policy::restore(encode(reset_raw{}, 8)),
                    Catch::Contains("state.last_event.index"));
  CHECK_THROWS_WITH(ulorl::reference_reset_policy::restore(encode(reset_raw{}, 0, true)),
                    Catch::Contains("trailing bytes"));
}

// ---- counters at their limits -----------------------------------------------------------------------
TEST_CASE("counters at their limits reject the call that would pass them and change nothing",
          "[control][checkpoint][limits]") {
  constexpr std::uint64_t limit = two_63 - 1;
  SECTION("KL controller updates") {
    kl_raw r;
    r.updates = limit;
    auto k = ulorl::kl_controller::restore(encode(r));
    const auto before = k.save();
    CHECK(arg_of([&] { k.update(0.1, 1); }) == "state.updates");
    CHECK(k.save() == before);
  }
  SECTION("entropy controller updates") {
    entropy_raw r;
    r.updates = limit;
    auto e = ulorl::entropy_controller::restore(encode(r));
    const auto before = e.save();
    CHECK(arg_of([&] { e.update(0.1); }) == "state.updates");
    CHECK(e.save() == before);
  }
  SECTION("reference reset: resets and evaluations") {
    reset_raw r;
    r.resets = limit;
    r.event_index = limit;
    r.evaluations = limit;
    r.evals_without_improvement = i64_max - 1;
    auto p = ulorl::reference_reset_policy::restore(encode(r));
    const auto before = p.save();
    CHECK(arg_of([&] { p.request_manual(10); }) == "state.resets");
    CHECK(arg_of([&] { p.observe_validation(10, 0.1); }) == "state.evaluations");
    CHECK(arg_of([&] { p.observe_step(100, 0.0, 1.0); }) == "state.resets");  // periodic: 100 - 3 >= 7
    CHECK(p.save() == before);
    // A call that does not reset still goes through.
    CHECK_FALSE(p.observe_step(5, 0.0, 1.0).reset_reference);
    CHECK(p.state().last_step == 5);
  }
  SECTION("reference reset: the consecutive KL-share count saturates") {
    // In a cooldown of 2^63 - 1 steps the kl_share trigger is suppressed forever and its count runs.
    reset_raw r{.every_n_steps = 0, .on_plateau = 0, .on_drop = 0, .cooldown_steps = i64_max, .has_best = 0,
                .best = 0.0, .evals_without_improvement = 0, .kl_over_steps = i64_max, .evaluations = 0,
                .event_step = 3, .event_trigger = 5, .event_value = 0.0};
    auto p = ulorl::reference_reset_policy::restore(encode(r));
    const auto a = p.observe_step(i64_max, 0.9, 0.1);
    CHECK(a.suppressed_by_cooldown);
    CHECK(a.trigger == ulorl::reset_trigger::kl_share);
    CHECK(p.state().kl_over_steps == i64_max);
    CHECK(p.cooldown_remaining() == 3);  // 2^63 - 1 - (2^63 - 1 - 3), no overflow
    CHECK_NOTHROW(ulorl::reference_reset_policy::restore(p.save()));
  }
}

namespace {

//! `golden` is what `m` saves, and restores to a machine that saves it again; returns that machine.
template <class Machine>
Machine require_pinned(const Machine& m, const std::vector<std::byte>& golden) {
  CHECK(m.save() == golden);
  auto r = Machine::restore(golden);
  CHECK(r.save() == golden);
  return r;
}

}  // namespace

TEST_CASE("pinned checkpoints: each controller saves these bytes and restores them", "[control][checkpoint][golden]") {
  SECTION("KL controller") {
    ulorl::kl_controller k({.type = ulorl::kl_control_type::adaptive, .init_coef = 0.05, .target_kl = 0.08,
                            .horizon = 2000, .min_coef = 1e-4, .max_coef = 2.0});
    k.update(0.1, 256);
    k.update(0.02, 128);
    const auto r = require_pinned(k, from_hex(
      "554c4f524c434b5001000100010000005100000000000000019a9999999999a93f7b14ae47e17ab43f0000000000409f"
      "409a9999999999c93f2d431cebe2361a3f0000000000000040632240ae56eba93f02000000000000007b14ae47e17a94"
      "3f9a9999999999c9bf56cb7b639ebc4d55"));
    CHECK((r.state().coef == k.state().coef && r.state().updates == 2));
  }
  SECTION("entropy controller") {
    ulorl::entropy_controller e({.rule = ulorl::entropy_control_rule::proportional, .target_entropy = 0.3,
                                 .init_coef = 0.01, .gain = 0.5, .tolerance = 0.01, .max_coef = 0.2,
                                 .gate_source = ulorl::entropy_gate_source::last_update, .raise_at_target = true});
    e.update(0.1);
    e.update(0.5);
    const auto r = require_pinned(e, from_hex(
      "554c4f524c434b5001000200020000005c0000000000000001333333333333d33f7b14ae47e17a843f7b14ae47e17a74"
      "3f7b14ae47e17a743f000000000000e03f7b14ae47e17a843f00000000000000009a9999999999c93f0101017014ae47"
      "e17a843f0200000000000000000000000000e03f0ebc2f5aba6e9734"));
    CHECK((r.config().gate_source == ulorl::entropy_gate_source::last_update && r.config().raise_at_target));
    CHECK(r.state().coef == e.state().coef);
  }
  SECTION("entropy controller, payload version 1") {
    // The seed tests/fuzz/corpus/fuzz_controller_restore/entropy-proportional, without its mode byte.
    const auto r = ulorl::entropy_controller::restore(from_hex(
      "554c4f524c434b5001000200010000005a00000000000000019a9999999999c93f7b14ae47e17a843f7b14ae47e17a74"
      "3f7b14ae47e17a743f9a9999999999a93f000000000000000000000000000000009a9999999999b93f017c14ae47e17a"
      "843f05000000000000009a9999999999d93fee4e05712ff3c33f"));
    CHECK(r.config().rule == ulorl::entropy_control_rule::proportional);
    CHECK(r.config().gate_source == ulorl::entropy_gate_source::current_batch);
    CHECK_FALSE(r.config().raise_at_target);
    CHECK((r.state().updates == 5 && r.state().last_entropy == 0.4));
    // Saved again, it is payload version 2: the same fields with gate_source and raise_at_target.
    (void)require_pinned(r, from_hex(
      "554c4f524c434b5001000200020000005c00000000000000019a9999999999c93f7b14ae47e17a843f7b14ae47e17a74"
      "3f7b14ae47e17a743f9a9999999999a93f000000000000000000000000000000009a9999999999b93f0100007c14ae47"
      "e17a843f05000000000000009a9999999999d93fc8798bdec6228900"));
  }
  SECTION("reference reset policy") {
    ulorl::reference_reset_policy p({.every_n_steps = 4, .patience = 2, .min_delta = 0.01, .on_drop = true,
                                     .max_drop = 0.2, .on_kl_share = true, .max_kl_share = 0.6,
                                     .kl_share_patience = 2, .cooldown_steps = 1});
    for (int i = 0; i < 6; ++i) {
      (void)p.observe_step(i, 0.1, 1.0);
      (void)p.observe_validation(i, 0.5 + 0.001 * i);
    }
    (void)p.observe_step(6, 3.0, 1.0);
    REQUIRE(p.state().resets == 2);
    REQUIRE(p.state().last_event.trigger == ulorl::reset_trigger::plateau);
    const auto r = require_pinned(p, from_hex(
      "554c4f524c434b500100030001000000920000000000000004000000000000000102000000000000007b14ae47e17a84"
      "3f01019a9999999999c93f01333333333333e33f02000000000000000100000000000000000101060000000000000004"
      "000000000000000101000000000000e03f01000000000000000100000000000000060000000000000002000000000000"
      "0004000000000000000254e3a59bc420e03f02000000000000009e24748388e20447"));
    CHECK((r.state().last_event.step == p.state().last_event.step && r.state().kl_over_steps == 1));
  }
}
