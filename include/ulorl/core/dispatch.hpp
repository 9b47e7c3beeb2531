// ulorl/core/dispatch.hpp — one dispatch from a run-time kind to compile-time code: a list of
// descriptor types, each with a static `kind`, and a visitor that calls a function with the
// descriptor whose kind matches. A kind that no descriptor of the list has is an error naming the
// function, the argument and the value: there is no fallback. name_table gives a list's names.
#pragma once

#include <array>
#include <string_view>
#include <type_traits>
#include <utility>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"

ULORL_NAMESPACE_BEGIN

//! A compile-time list of descriptor types (objectives, KL estimators).
template <class... D>
struct descriptor_list {};

namespace detail {
template <class Kind, class Config, class F, class D0, class... D>
decltype(auto) visit_known_kind(Kind kind, const Config& c, F&& f, descriptor_list<D0, D...>) {
  if constexpr (sizeof...(D) > 0) {
    if (kind != D0::kind) return visit_known_kind(kind, c, f, descriptor_list<D...>{});
  }
  D0 d;  // the last descriptor: `kind` is known, so it is this one
  d.config = c;
  return f(d);
}

//! f(d) with d a D{} whose `config` is c, for the descriptor D of the list whose kind is `kind`; an
//! unknown kind throws ulorl::error naming `fn`, `arg`, the value and the known values (the list's
//! kinds). Every branch of f must return the same type.
template <class Kind, class Config, class F, class... D>
decltype(auto) visit_kind(std::string_view fn, std::string_view arg, Kind kind, const Config& c, F&& f, descriptor_list<D...> list) {
  require_known(fn, arg, kind, D::kind...);
  return visit_known_kind(kind, c, f, list);
}
}  // namespace detail

//! The {name, kind} entries of a list's descriptors, in its order: the names of the list's enum
//! (value_of_name parses them, name_in prints them).
template <class D0, class... D>
[[nodiscard]] constexpr auto name_table(descriptor_list<D0, D...>) noexcept {
  using Kind = std::remove_cv_t<decltype(D0::kind)>;
  return std::array<std::pair<std::string_view, Kind>, 1 + sizeof...(D)>{
      {{D0::name, D0::kind}, {D::name, D::kind}...}};
}

//! The name of `value` in a {name, value} table; empty for a value the table does not hold.
template <class Table, class V>
[[nodiscard]] std::string_view name_in(const Table& table, V value) noexcept {
  for (const auto& [n, v] : table)
    if (v == value) return n;
  return {};
}

ULORL_NAMESPACE_END
