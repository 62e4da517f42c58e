#pragma once
/// \file
/// CPU-offload strategies for shared tables, as types (for `plan<Topology,
/// Offload>`) and as a run-time value (for tools that read a string).
///
/// - `offload::none`: tables are ordinary weights (read once, broadcast, device).
/// - `offload::per_rank_host`: read once, broadcast, kept in each rank's host memory.
/// - `offload::shared_host<single_reader>`: one local rank per node reads each
///   table into the node's shared segment; the others map it and get a placeholder.
/// - `offload::shared_host<cooperative>`: every local rank reads a disjoint slice
///   of each table into the same segment (read once, not by one reader).

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#include <sluice/error.hpp>
#include <sluice/policy/concepts.hpp>

namespace sluice::inline v0::policy {

/// The run-time form of an offload strategy.
enum class offload_kind : std::uint8_t { none, per_rank_host, shared_single, shared_cooperative };

namespace offload {
/// Tables are ordinary weights.
struct none {
  static constexpr offload_kind kind = offload_kind::none;
};
/// Tables in each rank's own host memory.
struct per_rank_host {
  static constexpr offload_kind kind = offload_kind::per_rank_host;
};
/// Readers tag: one local rank reads each table.
struct single_reader {};
/// Readers tag: every local rank reads a slice of each table.
struct cooperative {};
/// Tables in one shared host segment per node, read per `Readers`.
template <class Readers>
struct shared_host {
  static_assert(std::same_as<Readers, single_reader> || std::same_as<Readers, cooperative>,
                "sluice: shared_host<Readers> takes offload::single_reader or offload::cooperative");
  using readers = Readers;
  static constexpr offload_kind kind =
      std::same_as<Readers, cooperative> ? offload_kind::shared_cooperative : offload_kind::shared_single;
};
}  // namespace offload

/// An offload strategy type.
template <class O>
concept offload_strategy = requires {
  { O::kind } -> std::convertible_to<offload_kind>;
};

/// "none" | "per-rank" | "shared-single" | "shared-cooperative"
[[nodiscard]] constexpr std::string_view offload_name(offload_kind k) noexcept {
  switch (k) {
    case offload_kind::none: return "none";
    case offload_kind::per_rank_host: return "per-rank";
    case offload_kind::shared_single: return "shared-single";
    case offload_kind::shared_cooperative: return "shared-cooperative";
  }
  return "?";
}

namespace detail {
// Not constexpr: an offload literal it rejects does not compile (offload_spec).
[[noreturn]] inline void offload_name_error(std::string_view s) {
  throw config_error(fmt::format("offload '{}': expected none, per-rank, shared-single or shared-cooperative", s));
}
}  // namespace detail

/// Parses an offload_name, at compile time (offload_spec's literals) or at
/// run time (throws config_error listing the choices).
[[nodiscard]] constexpr offload_kind parse_offload(std::string_view s) {
  if (!std::is_constant_evaluated()) detail::count_run_time_parse();
  for (auto k : {offload_kind::none, offload_kind::per_rank_host, offload_kind::shared_single,
                 offload_kind::shared_cooperative})
    if (s == offload_name(k)) return k;
  detail::offload_name_error(s);
}

/// An offload strategy where an API takes one as text ("per-rank"): a
/// literal is parsed at compile time (one that names no strategy does not
/// compile), an offload strategy type gives its kind with no parse, and a
/// run-time string is parsed by the same parser when `kind()` is asked.
/// Refers to the text it was made from: a parameter type, not for storing.
class offload_spec {
 public:
  template <std::size_t N>
  consteval offload_spec(const char (&literal)[N])  // NOLINT(google-explicit-constructor)
      : text_(literal, N - 1), kind_(parse_offload(text_)), parsed_(true) {}
  constexpr offload_spec(std::string_view text) noexcept : text_(text) {}  // NOLINT(google-explicit-constructor)
  offload_spec(const std::string& text) noexcept : text_(text) {}         // NOLINT(google-explicit-constructor)
  template <class P>
    requires std::same_as<P, const char*> || std::same_as<P, char*>
  constexpr offload_spec(P text) noexcept : text_(text) {}  // NOLINT(google-explicit-constructor)
  constexpr offload_spec(offload_kind k) noexcept : kind_(k), parsed_(true) {}  // NOLINT(google-explicit-constructor)
  template <offload_strategy O>
  constexpr offload_spec(O) noexcept : kind_(O::kind), parsed_(true) {}  // NOLINT(google-explicit-constructor)

  /// Whether the kind is known without a run-time parse.
  [[nodiscard]] constexpr bool parsed() const noexcept { return parsed_; }
  /// The strategy (a run-time string: parsed now; throws config_error).
  [[nodiscard]] constexpr offload_kind kind() const { return parsed_ ? kind_ : parse_offload(text_); }

 private:
  std::string_view text_;
  offload_kind kind_ = offload_kind::none;
  bool parsed_ = false;
};

/// Whether tables go to the shared segment.
[[nodiscard]] constexpr bool is_shared(offload_kind k) noexcept {
  return k == offload_kind::shared_single || k == offload_kind::shared_cooperative;
}

}  // namespace sluice::inline v0::policy
