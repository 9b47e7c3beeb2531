// Fuzz target: the restore of each controller of ulorl/control (kl_controller, entropy_controller,
// reference_reset_policy), then a few updates with fuzzed measurements. Restoring either throws
// ulorl::error or gives a controller whose save() is the restored bytes exactly; every update
// either throws (and changes nothing) or keeps the controller's invariants: a finite coefficient
// within [min_coef, max_coef] (entropy: [min(init_coef, min_coef), max(init_coef, max_coef)]), counters that count, and a checkpoint that restores to the same
// bytes. The first input byte picks the controller (byte % 3), the mode ((byte / 3) % 2) and the
// path ((byte / 6) % 2):
//   raw         the rest of the input is the checkpoint;
//   structured  a well-formed checkpoint (header, exact payload length, 0/1 booleans) whose fields
//               are fuzzed values biased towards edge cases, counters towards their limit 2^63 - 1
//               (an update at the limit must be refused, one below it must give a checkpoint that
//               restores), so the checks behind the header are what is fuzzed;
//   file        the checkpoint is also written to a regular file and read with restore_from_file,
//               which must agree with restore (both refuse, or both give the same checkpoint).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "fuzz_common.hpp"
#include "ulorl/control.hpp"
#include "ulorl/core/checkpoint_file.hpp"

namespace {

using bytes = std::vector<std::byte>;
using ulorl::detail::byte_writer;

template <class C>
bytes saved(const C& c) {
  return c.save();
}

//! Runs `call`; when it throws ulorl::error the controller's checkpoint must be unchanged.
template <class C, class F>
bool rejected_unchanged(const C& c, F&& call) {
  const auto before = saved(c);
  try {
    call();
  } catch (const ulorl::error&) {
    FUZZ_CHECK(saved(c) == before);
    return true;
  }
  return false;
}

//! C::restore(b), or nothing when it throws ulorl::error; with `via_file` also through a file,
//! which must agree.
template <class C>
std::optional<C> restored(std::span<const std::byte> b, bool via_file) {
  return fuzz::restore_both<C>(
      b, via_file, [](auto bytes) { return C::restore(bytes); },
      [](const std::string& path) { return ulorl::restore_from_file<C>(path); },
      [](const C& x, const C& y) { return saved(x) == saved(y); });
}

template <class C>
void roundtrip(const C& c) {
  const auto b = saved(c);
  try {
    const auto back = C::restore(b);
    FUZZ_CHECK(saved(back) == b);
  } catch (const ulorl::error& e) {
    std::fprintf(stderr, "a controller's own checkpoint is rejected: %s\n", e.what());
    FUZZ_CHECK(!"C::restore(c.save()) threw");
  }
}

double measurement(FuzzedDataProvider& p) {
  return p.ConsumeBool() ? p.ConsumeFloatingPointInRange<double>(-1.0, 2.0) : fuzz::any_double(p);
}

// ---- kl_controller --------------------------------------------------------------------------------

void kl_fields(byte_writer& w, FuzzedDataProvider& p) {
  w.u8(p.ConsumeIntegralInRange<std::uint8_t>(0, 2));  // type: fixed, adaptive, unknown
  for (int i = 0; i < 7; ++i) w.f64(fuzz::any_double(p));  // init, target, horizon, max_error, min, max, coef
  w.u64(fuzz::near_limit(p));  // updates
  w.f64(fuzz::any_double(p));
  w.f64(fuzz::any_double(p));
}

void check(const ulorl::kl_controller& k) {
  const auto& c = k.config();
  FUZZ_CHECK(std::isfinite(k.value()));
  FUZZ_CHECK(k.value() >= c.min_coef && k.value() <= c.max_coef);
}

void run_kl(std::span<const std::byte> b, FuzzedDataProvider& p, bool via_file) {
  auto k = restored<ulorl::kl_controller>(b, via_file);
  if (!k) return;
  FUZZ_CHECK(fuzz::same_bytes(saved(*k), b));
  check(*k);
  for (int i = 0; i < 6 && p.remaining_bytes() > 0; ++i) {
    const double kl = measurement(p);
    const std::int64_t n = p.ConsumeBool() ? p.ConsumeIntegralInRange<std::int64_t>(0, 4096) : fuzz::any_int64(p);
    const auto before = k->state();
    if (!rejected_unchanged(*k, [&] { (void)k->update(kl, n); })) {
      FUZZ_CHECK(k->state().updates == before.updates + 1);
      if (k->config().type == ulorl::kl_control_type::fixed) FUZZ_CHECK(k->value() == before.coef);
      check(*k);
    } else {
      // A plausible measurement is rejected only when the update counter is at its documented limit.
      FUZZ_CHECK(!(std::fabs(kl) <= 100.0 && n >= 0 && n <= 1'000'000) || before.updates >= ulorl::control_counter_limit);
    }
    roundtrip(*k);
  }
}

// ---- entropy_controller ---------------------------------------------------------------------------

void entropy_fields(byte_writer& w, FuzzedDataProvider& p) {
  w.u8(p.ConsumeIntegralInRange<std::uint8_t>(0, 2));  // rule: step, proportional, unknown
  for (int i = 0; i < 8; ++i) w.f64(fuzz::any_double(p));  // target, init, up, down, gain, tol, min, max
  w.boolean(p.ConsumeBool());                          // gate_above_target
  w.u8(p.ConsumeIntegralInRange<std::uint8_t>(0, 2));  // gate_source: current_batch, last_update, unknown
  w.boolean(p.ConsumeBool());                          // raise_at_target
  w.f64(fuzz::any_double(p));  // coef
  w.u64(fuzz::near_limit(p));  // updates
  w.f64(fuzz::any_double(p));
}

void check(const ulorl::entropy_controller& e) {
  const auto& c = e.config();
  FUZZ_CHECK(std::isfinite(e.value()));
  FUZZ_CHECK(e.value() >= std::fmin(c.init_coef, c.min_coef) && e.value() <= std::fmax(c.init_coef, c.max_coef));
}

void run_entropy(std::span<const std::byte> b, FuzzedDataProvider& p, bool via_file) {
  auto e = restored<ulorl::entropy_controller>(b, via_file);
  if (!e) return;
  // A payload of version 1 is also read, and saved back as the current version.
  std::uint32_t version = 0;
  for (std::size_t i = 0; i < 4; ++i) version |= static_cast<std::uint32_t>(b[12 + i]) << (8 * i);
  if (version == ulorl::entropy_controller_payload_version) FUZZ_CHECK(fuzz::same_bytes(saved(*e), b));
  else FUZZ_CHECK(version == 1);
  check(*e);
  for (int i = 0; i < 6 && p.remaining_bytes() > 0; ++i) {
    const double h = measurement(p);
    double bonus = 0.0;
    if (!rejected_unchanged(*e, [&] { bonus = e->bonus(h); })) {
      FUZZ_CHECK(bonus == 0.0 || bonus == e->value());
      FUZZ_CHECK(std::isfinite(bonus));
    }
    if (!rejected_unchanged(*e, [&] { bonus = e->bonus(); })) {
      FUZZ_CHECK(bonus == 0.0 || bonus == e->value());
      FUZZ_CHECK(std::isfinite(bonus));
    }
    const auto before = e->state();
    if (!rejected_unchanged(*e, [&] { (void)e->update(h); })) {
      FUZZ_CHECK(e->state().updates == before.updates + 1);
      check(*e);
    } else {
      FUZZ_CHECK(!(std::fabs(h) <= 100.0) || before.updates >= ulorl::control_counter_limit);
    }
    roundtrip(*e);
  }
}

// ---- reference_reset_policy -----------------------------------------------------------------------

void reset_fields(byte_writer& w, FuzzedDataProvider& p) {
  const auto i64 = [&] { w.i64(p.ConsumeBool() ? p.ConsumeIntegralInRange<std::int64_t>(-1, 12) : fuzz::any_int64(p)); };
  i64();  // every_n_steps
  w.boolean(p.ConsumeBool());
  i64();  // patience
  w.f64(fuzz::any_double(p));
  w.boolean(p.ConsumeBool());
  w.boolean(p.ConsumeBool());
  w.f64(fuzz::any_double(p));
  w.boolean(p.ConsumeBool());
  w.f64(p.ConsumeBool() ? p.ConsumeFloatingPointInRange<double>(0.0, 1.0) : fuzz::any_double(p));
  i64();  // kl_share_patience
  i64();  // cooldown_steps
  w.boolean(p.ConsumeBool());
  w.boolean(p.ConsumeBool());
  // state
  w.boolean(p.ConsumeBool());
  i64();  // last_step
  i64();  // anchor_step
  w.boolean(p.ConsumeBool());
  w.boolean(p.ConsumeBool());
  w.f64(fuzz::any_double(p));
  i64();  // evals_without_improvement
  i64();  // kl_over_steps
  const auto counter = [&] { return p.ConsumeBool() ? p.ConsumeIntegralInRange<std::uint64_t>(0, 4) : fuzz::near_limit(p); };
  w.u64(counter());  // evaluations
  const auto resets = counter();
  w.u64(resets);
  i64();  // last_event.step
  w.u8(p.ConsumeIntegralInRange<std::uint8_t>(0, 6));
  w.f64(fuzz::any_double(p));
  w.u64(p.ConsumeBool() ? resets : counter());  // last_event.index (= resets when valid)
}

void check(const ulorl::reference_reset_policy& r, const ulorl::reset_action& a, std::uint64_t resets_before) {
  const auto& s = r.state();
  FUZZ_CHECK(r.cooldown_remaining() >= 0);
  FUZZ_CHECK(s.resets == resets_before + (a.reset_reference ? 1u : 0u));
  FUZZ_CHECK(!(a.reset_reference && a.suppressed_by_cooldown));
  if (a.suppressed_by_cooldown || a.reset_reference) FUZZ_CHECK(a.trigger != ulorl::reset_trigger::none);
  if (a.reset_reference) {
    FUZZ_CHECK(a.event.index == s.resets && a.event.step == s.last_step && s.anchor_step == s.last_step);
    FUZZ_CHECK(s.evals_without_improvement == 0 && s.kl_over_steps == 0);
    FUZZ_CHECK(a.reset_optimizer == r.config().reset_optimizer);
  }
}

void run_reset(std::span<const std::byte> b, FuzzedDataProvider& p, bool via_file) {
  auto r = restored<ulorl::reference_reset_policy>(b, via_file);
  if (!r) return;
  FUZZ_CHECK(fuzz::same_bytes(saved(*r), b));
  FUZZ_CHECK(r->cooldown_remaining() >= 0);
  for (int i = 0; i < 8 && p.remaining_bytes() > 0; ++i) {
    const auto last = r->state().last_step;
    std::int64_t step = fuzz::any_int64(p);
    if (p.ConsumeBool() && last <= std::numeric_limits<std::int64_t>::max() - 8)
      step = last + p.ConsumeIntegralInRange<std::int64_t>(0, 8);
    const auto resets = r->state().resets;
    ulorl::reset_action a;
    const int which = p.ConsumeIntegralInRange<int>(0, 2);
    const double x = measurement(p), y = measurement(p);
    const bool rejected = rejected_unchanged(*r, [&] {
      a = which == 0 ? r->observe_step(step, x, y) : which == 1 ? r->observe_validation(step, x) : r->request_manual(step);
    });
    if (!rejected) {
      FUZZ_CHECK(r->state().last_step == step && step >= 0);
      check(*r, a, resets);
    } else if (step >= last && std::isfinite(x) && std::isfinite(y)) {
      // A call on a valid clock with finite values is refused only at a counter limit.
      const auto& s = r->state();
      FUZZ_CHECK(s.resets >= ulorl::checkpoint_counter_limit || (which == 1 && s.evaluations >= ulorl::checkpoint_counter_limit));
    }
    roundtrip(*r);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const int kind = data[0] % 3;
  const bool structured = (data[0] / 3) % 2 == 1;
  const bool via_file = (data[0] / 6) % 2 == 1;
  FuzzedDataProvider p(data + 1, size - 1);
  bytes b;
  if (structured) {
    static constexpr ulorl::checkpoint_kind kinds[] = {ulorl::checkpoint_kind::kl_controller, ulorl::checkpoint_kind::entropy_controller,
                                                       ulorl::checkpoint_kind::reference_reset};
    static constexpr std::uint32_t versions[] = {ulorl::kl_controller_payload_version, ulorl::entropy_controller_payload_version,
                                                 ulorl::reference_reset_payload_version};
    const auto at = ulorl::detail::begin_checkpoint(b, kinds[kind], versions[kind]);
    byte_writer w(b);
    if (kind == 0) kl_fields(w, p);
    else if (kind == 1) entropy_fields(w, p);
    else reset_fields(w, p);
    ulorl::detail::finish_checkpoint(b, at);
  } else {
    const auto rest = fuzz::as_bytes(data + 1, size - 1);
    b.assign(rest.begin(), rest.end());
  }
  if (kind == 0) run_kl(b, p, via_file);
  else if (kind == 1) run_entropy(b, p, via_file);
  else run_reset(b, p, via_file);
  return 0;
}
