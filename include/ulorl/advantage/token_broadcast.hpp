// ulorl/advantage/token_broadcast.hpp — per-response advantages to per-token advantages, in both
// layouts. Placement is where the frameworks differ:
//   masked          adv[i,t] = a_i · m[i,t]                      (verl, TRL, Open-Instruct)
//   through_last    adv[i,t] = a_i for t <= e_i (last valid t), 0 after; holes before e_i keep a_i
//                   (OpenRLHF; a row without valid tokens is all 0)
//   every_position  adv[i,t] = a_i for every t, mask ignored    (NeMo-RL)
// advantage_preset pairs a group_advantage_config with the broadcast_config of its framework.
#pragma once

#include <cstddef>
#include <span>

#include "ulorl/advantage/group_advantage.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"

ULORL_NAMESPACE_BEGIN

enum class token_placement { masked, through_last, every_position };

struct broadcast_config {
  token_placement placement = token_placement::masked;
  //! A mask row of zeros means a response whose advantage reaches no token: an error unless allowed
  //! (the frameworks' presets allow it and write zeros).
  bool allow_empty_rows = false;
};

//! Writes out(i, t) from advantages[i] and the 0/1 mask (same layout and shape as out; an absent
//! mask, an empty view: every token of out's layout valid).
template <class T, class M, class U>
void broadcast_to_tokens(std::span<const T> advantages, token_view<const M> mask, token_view<U> out,
                         const broadcast_config& cfg = {}) {
  constexpr std::string_view fn = "broadcast_to_tokens";
  require_known(fn, "config.placement", cfg.placement, token_placement::masked, token_placement::through_last,
                token_placement::every_position);
  if (mask.empty()) validate_layout(fn, "out", out);
  mask = mask_or_all_valid(mask, out);
  validate_layout(fn, "mask", mask);
  require_same_shape(fn, "out", out, "mask", mask);
  require_same_size(fn, "advantages", advantages.size(), "mask rows", mask.rows());
  require_all_finite(fn, "advantages", vector_view<const T>(advantages));
  require_binary_mask(fn, "mask", mask);
  if (!cfg.allow_empty_rows)
    for (std::size_t b = 0; b < mask.rows(); ++b)
      if (row_tokens(mask, b) == 0)
        detail::fail_at(fn, "mask", static_cast<std::int64_t>(b), 0, "row has no valid token (a mask row of zeros)");

  for (std::size_t b = 0; b < mask.rows(); ++b) {
    const auto m = mask.row(b);
    const auto o = out.row(b);
    const U a = static_cast<U>(advantages[b]);
    switch (cfg.placement) {
      case token_placement::masked:
        for (std::size_t t = 0; t < o.size(); ++t) o[t] = m[t] != M(0) ? a : U(0);
        break;
      case token_placement::every_position:
        for (std::size_t t = 0; t < o.size(); ++t) o[t] = a;
        break;
      case token_placement::through_last: {
        std::size_t end = 0;  // one past the last valid token
        for (std::size_t t = 0; t < m.size(); ++t)
          if (m[t] != M(0)) end = t + 1;
        for (std::size_t t = 0; t < o.size(); ++t) o[t] = t < end ? a : U(0);
        break;
      }
    }
  }
}

//! How per-response advantages are computed and how they reach the tokens: the value every
//! framework preset of the advantages returns (ulorl/presets/<framework>.hpp), or a custom pair.
struct advantage_preset {
  group_advantage_config group;
  broadcast_config broadcast;
};

ULORL_NAMESPACE_END
