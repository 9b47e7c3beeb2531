// tests/support/rollout_oracle.hpp — a deliberately naive model of UloRL segment rollout, written
// from docs/segment_rollout.md and independent of include/ulorl/rollout/ (it includes none of it).
// Responses keep one policy version PER TOKEN (no spans), groups live in a std::map keyed by id, the
// plan is recomputed from scratch by scanning everything, and completion order is a sequence number.
// Its answers (plans, accepted/rejected reports, released groups, per-token old log-prob versions and
// recompute flags) are what the property tests compare the production scheduler against.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

namespace oracle {

enum class outcome { segment_end, eos, failed };
enum class rstate { decoding, paused, finished, truncated };
enum class mode { tois, sais, pois };

struct config {
  int group_size = 8;
  std::int64_t max_tokens = 64;
  int segments = 4;
  std::int64_t max_active = 0;
  std::int64_t max_decode_tokens = 0;
  std::int64_t max_new_groups = 0;
  bool admission_order = false;
  std::int64_t batch_groups = 0;
  std::int64_t max_staleness = -1;
  bool drop_stale = false;
};

struct response {
  rstate st = rstate::paused;
  std::vector<std::int64_t> versions;  // one per committed token
  int failures = 0;
  int decode_steps = 0;
  std::int64_t finish_step = -1;
};

struct group {
  std::vector<response> r;
  std::int64_t admitted_step = 0;
  std::int64_t completion_seq = -1;  // -1 while incomplete
};

struct item {
  std::int64_t response_id, start, quota, version;
};

struct released {
  std::int64_t group_id;
  std::vector<response> responses;
  std::int64_t admitted_step;
};

class naive_scheduler {
 public:
  explicit naive_scheduler(config c) : c_(c) {}

  std::int64_t seg() const { return (c_.max_tokens + c_.segments - 1) / c_.segments; }
  std::int64_t quota(std::int64_t t) const {
    // The next segment boundary strictly after t, capped at L_max.
    std::int64_t b = seg();
    while (b <= t) b += seg();
    return std::min(b, c_.max_tokens) - t;
  }
  std::int64_t active() const {
    std::int64_t n = 0;
    for (const auto& [id, g] : live_)
      for (const auto& r : g.r) n += (r.st == rstate::paused || r.st == rstate::decoding);
    return n;
  }

  void offer(std::int64_t n) { offered_ += n; }
  void update_policy(std::int64_t v) { version_ = v; }
  std::int64_t version() const { return version_; }
  bool open() const { return open_; }

  // Returns false where the production scheduler must throw.
  bool plan(std::vector<item>& out) {
    if (open_) return false;
    out.clear();
    reported_.clear();
    std::int64_t budget = c_.max_decode_tokens > 0 ? c_.max_decode_tokens : (std::int64_t{1} << 62);
    std::int64_t used = 0;
    bool blocked = false;
    for (auto& [id, g] : live_) {
      if (g.completion_seq >= 0) continue;
      for (int k = 0; k < c_.group_size; ++k) {
        auto& r = g.r[static_cast<std::size_t>(k)];
        if (r.st != rstate::paused) continue;
        if (c_.drop_stale && c_.max_staleness >= 0 && !r.versions.empty() &&
            version_ - r.versions.front() > c_.max_staleness) {
          dropped_ += static_cast<std::int64_t>(r.versions.size());
          r.versions.clear();
        }
        if (blocked) continue;
        const auto q = quota(static_cast<std::int64_t>(r.versions.size()));
        if (used + q > budget) {
          blocked = true;
          continue;
        }
        used += q;
        r.st = rstate::decoding;
        out.push_back({id * c_.group_size + k, static_cast<std::int64_t>(r.versions.size()), q, version_});
      }
    }
    std::int64_t admitted = 0;
    while (!blocked && next_ < offered_) {
      if (c_.max_active > 0 && active() + c_.group_size > c_.max_active) break;
      if (c_.max_new_groups > 0 && admitted >= c_.max_new_groups) break;
      if (used + quota(0) * c_.group_size > budget) break;
      group g;
      g.r.resize(static_cast<std::size_t>(c_.group_size));
      g.admitted_step = step_;
      for (int k = 0; k < c_.group_size; ++k) {
        g.r[static_cast<std::size_t>(k)].st = rstate::decoding;
        out.push_back({next_ * c_.group_size + k, 0, quota(0), version_});
      }
      used += quota(0) * c_.group_size;
      live_[next_] = std::move(g);
      ++next_;
      ++admitted;
    }
    plan_ = out;
    plan_pos_.clear();
    for (std::size_t i = 0; i < plan_.size(); ++i) plan_pos_[plan_[i].response_id] = i;
    open_ = true;
    return true;
  }

  bool report(std::int64_t id, std::int64_t n, outcome o) {
    if (!open_) return false;
    const auto pos = plan_pos_.find(id);
    if (pos == plan_pos_.end() || reported_.count(id)) return false;
    const item* it = &plan_[pos->second];
    if (n < 0 || n > it->quota) return false;
    if (o == outcome::segment_end && n != it->quota) return false;
    reported_.insert(id);
    auto& g = live_.at(id / c_.group_size);
    auto& r = g.r[static_cast<std::size_t>(id % c_.group_size)];
    for (std::int64_t i = 0; i < n; ++i) r.versions.push_back(it->version);
    generated_ += n;
    if (n > 0) ++r.decode_steps;
    if (o == outcome::failed) {
      ++r.failures;
      if (static_cast<std::int64_t>(r.versions.size()) == c_.max_tokens) finish(g, r, rstate::truncated);
      else r.st = rstate::paused;
    } else if (o == outcome::eos) {
      finish(g, r, rstate::finished);
    } else if (static_cast<std::int64_t>(r.versions.size()) == c_.max_tokens) {
      finish(g, r, rstate::truncated);
    } else {
      r.st = rstate::paused;
    }
    return true;
  }

  bool end_step() {
    if (!open_) return false;
    for (const auto& x : plan_) {
      if (reported_.count(x.response_id)) continue;
      auto& r = live_.at(x.response_id / c_.group_size).r[static_cast<std::size_t>(x.response_id % c_.group_size)];
      r.st = rstate::paused;
      ++r.failures;
    }
    plan_.clear();
    open_ = false;
    ++step_;
    return true;
  }

  std::vector<released> take(bool partial) {
    std::vector<std::int64_t> avail;  // group ids in release order
    if (c_.admission_order) {
      for (const auto& [id, g] : live_) {
        if (g.completion_seq < 0) break;
        avail.push_back(id);
      }
    } else {
      std::vector<std::pair<std::int64_t, std::int64_t>> by_seq;
      for (const auto& [id, g] : live_)
        if (g.completion_seq >= 0) by_seq.push_back({g.completion_seq, id});
      std::sort(by_seq.begin(), by_seq.end());
      for (const auto& p : by_seq) avail.push_back(p.second);
    }
    auto n = static_cast<std::int64_t>(avail.size());
    if (c_.batch_groups > 0) n = n >= c_.batch_groups ? c_.batch_groups : (partial ? n : 0);
    std::vector<released> out;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto id = avail[static_cast<std::size_t>(i)];
      auto& g = live_.at(id);
      out.push_back({id, g.r, g.admitted_step});
      for (const auto& r : g.r) released_tokens_ += static_cast<std::int64_t>(r.versions.size());
      live_.erase(id);
    }
    return out;
  }

  std::int64_t generated() const { return generated_; }
  std::int64_t dropped() const { return dropped_; }
  std::int64_t released_tokens() const { return released_tokens_; }
  std::int64_t step() const { return step_; }
  const std::map<std::int64_t, group>& live() const { return live_; }

 private:
  void finish(group& g, response& r, rstate st) {
    r.st = st;
    r.finish_step = step_;
    for (const auto& x : g.r)
      if (x.st != rstate::finished && x.st != rstate::truncated) return;
    g.completion_seq = seq_++;
  }

  config c_;
  std::map<std::int64_t, group> live_;
  std::int64_t next_ = 0, offered_ = 0, version_ = 0, step_ = 0, seq_ = 0;
  std::int64_t generated_ = 0, dropped_ = 0, released_tokens_ = 0;
  bool open_ = false;
  std::vector<item> plan_;
  std::map<std::int64_t, std::size_t> plan_pos_;
  std::set<std::int64_t> reported_;
};

//! Per-token old-log-prob version; nullopt where the mode does not apply (TOIS, multi-version).
inline std::optional<std::vector<std::int64_t>> old_versions(const std::vector<std::int64_t>& tok_versions, mode m,
                                                             std::int64_t current, std::int64_t max_staleness) {
  std::vector<std::int64_t> out(tok_versions.size());
  for (std::size_t t = 0; t < tok_versions.size(); ++t) {
    const auto v = tok_versions[t];
    if (m == mode::tois) {
      if (v != tok_versions.front()) return std::nullopt;
      out[t] = v;
    } else if (m == mode::pois) {
      out[t] = current;
    } else {
      out[t] = (max_staleness >= 0 && current - v > max_staleness) ? current : v;
    }
  }
  return out;
}

//! Per-token recompute flag: the old log-prob is not the one the sampling version recorded.
inline std::vector<std::uint8_t> recompute_flags(const std::vector<std::int64_t>& tok_versions,
                                                 const std::vector<std::int64_t>& old, bool trust) {
  std::vector<std::uint8_t> out(tok_versions.size());
  for (std::size_t t = 0; t < out.size(); ++t) out[t] = (!trust || old[t] != tok_versions[t]) ? 1 : 0;
  return out;
}

}  // namespace oracle
