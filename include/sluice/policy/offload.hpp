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

#include <cstdint>
#include <string_view>

#include <fmt/format.h>

#include <sluice/error.hpp>

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

/// Parses an offload_name (throws config_error listing the choices).
[[nodiscard]] inline offload_kind parse_offload(std::string_view s) {
  for (auto k : {offload_kind::none, offload_kind::per_rank_host, offload_kind::shared_single,
                 offload_kind::shared_cooperative})
    if (s == offload_name(k)) return k;
  throw config_error(fmt::format("offload '{}': expected none, per-rank, shared-single or shared-cooperative", s));
}

/// Whether tables go to the shared segment.
[[nodiscard]] constexpr bool is_shared(offload_kind k) noexcept {
  return k == offload_kind::shared_single || k == offload_kind::shared_cooperative;
}

}  // namespace sluice::inline v0::policy
