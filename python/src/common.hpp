// python/src/common.hpp — shared declarations of the `ulorl._ulorl` extension's translation units:
// module.cpp (configurations, presets, controllers, scheduler; no torch headers), losses.cpp
// (policy loss, advantages, masks on tensors), logits.cpp (the fused logits / linear-head paths) and
// corrections.cpp (rollout correction, further advantage estimators, aggregation, KL penalty,
// off-policy mask, the frameworks' batch passes).
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <ulorl/core/dispatch.hpp>
#include <ulorl/core/error.hpp>
#include <ulorl/core/fields.hpp>
#include <ulorl/loss/policy_loss.hpp>
#include <ulorl/presets/trl.hpp>
#include <ulorl/presets/verl.hpp>

namespace ulorl_py {

namespace py = pybind11;

//! Name -> enum value through the library's one parser (ulorl::value_of_name): ulorl::error listing
//! the known names.
template <class E>
E parse_name(std::string_view fn, std::string_view arg, std::string_view name,
             std::initializer_list<std::pair<std::string_view, E>> known) {
  return ulorl::value_of_name(fn, arg, name, known);
}

namespace detail {
//! The value type of a {name, value} table's entries (std::pair, presets::detail::name_entry).
template <class Entry>
constexpr auto entry_value(const Entry& e) {
  const auto& [n, v] = e;
  return v;
}
template <class Table>
using table_value_t = std::remove_cvref_t<decltype(entry_value(*std::begin(std::declval<const Table&>())))>;
template <class X>
struct optional_enum : std::false_type {};
template <class E>
struct optional_enum<std::optional<E>> : std::is_enum<E> {
  using type = E;
};
//! The one of `tables` whose values are of type E.
template <class E, class T0, class... T>
const auto& table_for(const T0& t0, const T&... t) {
  if constexpr (std::is_same_v<table_value_t<T0>, E>)
    return t0;
  else
    return table_for<E>(t...);
}
//! f(field) for the field `key` of record c's table.
template <class C, class F>
void with_field(C& c, std::string_view key, F&& f) {
  visit_fields(c, [&](std::string_view n, auto& field) {
    if (n == key) f(field);
  });
}
}  // namespace detail

//! Read-write attributes of `cls`, one per field of C's table (visit_fields, core/fields.hpp), by
//! the table's names: numbers, bools, optionals and records as Python values; an enum (or an
//! optional one: None or a name) by its name in the one of `tables` ({name, value} entries of
//! static storage) whose values are of its type (an unknown name is ulorl.Error naming `fn` and the
//! field). The table is the list: a field added to it is an
//! attribute without another edit.
template <class C, class... Tables>
void def_fields(py::class_<C>& cls, std::string_view fn, const Tables&... tables) {
  C probe{};
  visit_fields(probe, [&](std::string_view name, auto& field) {
    using X = std::remove_cvref_t<decltype(field)>;
    const std::string key(name), function(fn);
    const auto get = [key](C& c) {
      py::object out;
      detail::with_field(c, key, [&](auto& f) {
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(f)>, X>) out = py::cast(f);
      });
      return out;
    };
    const auto set = [key](C& c, const X& v) {
      detail::with_field(c, key, [&](auto& f) {
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(f)>, X>) f = v;
      });
    };
    if constexpr (std::is_enum_v<X>) {
      const auto& table = detail::table_for<X>(tables...);  // a table of static storage
      cls.def_property(
          key.c_str(),
          [key, &table](C& c) {
            std::string out;
            detail::with_field(c, key, [&](auto& f) {
              if constexpr (std::is_same_v<std::remove_cvref_t<decltype(f)>, X>) out = ulorl::name_in(table, f);
            });
            return out;
          },
          [set, &table, function, key](C& c, const std::string& v) {
            set(c, ulorl::value_of_name(function, key, v, table));
          });
    } else if constexpr (detail::optional_enum<X>::value) {  // None or a name
      using E = typename detail::optional_enum<X>::type;
      const auto& table = detail::table_for<E>(tables...);
      cls.def_property(
          key.c_str(),
          [key, &table](C& c) {
            std::optional<std::string> out;
            detail::with_field(c, key, [&](auto& f) {
              if constexpr (std::is_same_v<std::remove_cvref_t<decltype(f)>, X>)
                if (f) out = std::string(ulorl::name_in(table, *f));
            });
            return out;
          },
          [set, &table, function, key](C& c, const std::optional<std::string>& v) {
            set(c, v ? X(ulorl::value_of_name(function, key, *v, table)) : X());
          });
    } else {
      cls.def_property(key.c_str(), get, set);
    }
  });
}

//! TRL's `scale_rewards` names.
inline ulorl::presets::trl::scale_rewards trl_scale_rewards_of(std::string_view fn, std::string_view name) {
  using S = ulorl::presets::trl::scale_rewards;
  return parse_name<S>(fn, "scale_rewards", name, {{"group", S::group}, {"batch", S::batch}, {"none", S::none}});
}

//! verl's normaliser options from its option names (`loss_agg_mode` by name).
inline ulorl::presets::verl::normalizer_options verl_normalizer_options(
    const std::string& loss_agg_mode, double dp_size, std::optional<double> batch_num_tokens,
    std::optional<double> global_batch_size, std::optional<double> loss_scale_factor, std::size_t padded_length) {
  return {.loss_agg_mode = ulorl::presets::verl::loss_agg_mode_from_name(loss_agg_mode),
          .dp_size = dp_size,
          .batch_num_tokens = batch_num_tokens,
          .global_batch_size = global_batch_size,
          .loss_scale_factor = loss_scale_factor,
          .padded_length = padded_length};
}

//! The metrics and loss parts of one call as a Python dict.
py::dict result_dict(const ulorl::policy_loss_result& r);

void bind_losses(py::module_& m);
void bind_logits(py::module_& m);
void bind_corrections(py::module_& m);

}  // namespace ulorl_py
