#pragma once
/// \file
/// `topology<TP, DP, EP, PP = 1>`: the parallel layout of an inference server,
/// with compile-time sizes or `policy::dynamic` ones stored at run time (the
/// `std::extents` idea). The world is TP x DP x PP ranks: PP pipeline stages
/// of TP x DP ranks each. Expert parallelism spans a stage (as vLLM's
/// `--enable-expert-parallel` does within a pipeline stage), so EP must divide
/// TP x DP. PP is the last parameter (default 1), so `topology<TP, DP, EP>`
/// keeps its meaning.
///
/// Rank coordinates of global rank r (stages are contiguous blocks of ranks,
/// TP ranks adjacent): pp_rank = r / (TP*DP); with s = r % (TP*DP),
/// tp_rank = s % TP, dp_rank = s / TP, ep_rank = s % EP (ranks of a stage
/// with equal ep_rank hold the same experts when EP < TP*DP).

#include <cstddef>
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#include <sluice/error.hpp>
#include <sluice/policy/concepts.hpp>

namespace sluice::inline v0::policy {

/// Coordinates of one rank.
struct rank_coords {
  rank_t rank = 0;
  std::size_t tp_rank = 0;
  std::size_t dp_rank = 0;
  std::size_t ep_rank = 0;
  std::size_t pp_rank = 0;  ///< pipeline stage
  friend bool operator==(const rank_coords&, const rank_coords&) = default;
};

namespace detail {
// I tells the four extents apart, so that empty ones share one address.
template <std::size_t N, int I>
struct extent_store {  // a static size: nothing stored
  constexpr explicit extent_store(std::size_t) noexcept {}
  [[nodiscard]] static constexpr std::size_t get() noexcept { return N; }
};
template <int I>
struct extent_store<dynamic, I> {
  constexpr explicit extent_store(std::size_t n) noexcept : n_(n) {}
  [[nodiscard]] constexpr std::size_t get() const noexcept { return n_; }
  std::size_t n_;
};
}  // namespace detail

/// A TP x DP x PP world with EP-way expert parallelism within each stage.
/// Each size is static, or `dynamic` and given to the constructor. Invalid
/// static sizes do not compile; invalid dynamic ones throw config_error from
/// the constructor.
template <std::size_t TP, std::size_t DP, std::size_t EP, std::size_t PP = 1>
class topology {
  static_assert(TP == dynamic || TP >= 1, "sluice: TP must be >= 1");
  static_assert(DP == dynamic || DP >= 1, "sluice: DP must be >= 1");
  static_assert(EP == dynamic || EP >= 1, "sluice: EP must be >= 1");
  static_assert(PP == dynamic || PP >= 1, "sluice: PP must be >= 1");
  static_assert(TP == dynamic || DP == dynamic || EP == dynamic || (TP * DP) % EP == 0,
                "sluice: EP must divide the world size TP*DP");

 public:
  static constexpr std::size_t static_tp = TP, static_dp = DP, static_ep = EP, static_pp = PP;
  /// True when every size is known at compile time.
  static constexpr bool is_static = TP != dynamic && DP != dynamic && EP != dynamic && PP != dynamic;

  /// Static topologies: no arguments.
  constexpr topology() noexcept requires is_static : tp_(TP), dp_(DP), ep_(EP), pp_(PP) {}
  /// Sizes for the dynamic extents (static ones must be passed equal).
  constexpr topology(std::size_t tp, std::size_t dp, std::size_t ep, std::size_t pp = 1)
      : tp_(tp), dp_(dp), ep_(ep), pp_(pp) {
    if (TP != dynamic && tp != TP) throw config_error(fmt::format("topology: TP is {}, not {}", TP, tp));
    if (DP != dynamic && dp != DP) throw config_error(fmt::format("topology: DP is {}, not {}", DP, dp));
    if (EP != dynamic && ep != EP) throw config_error(fmt::format("topology: EP is {}, not {}", EP, ep));
    if (PP != dynamic && pp != PP) throw config_error(fmt::format("topology: PP is {}, not {}", PP, pp));
    if (tp == 0 || dp == 0 || ep == 0 || pp == 0) throw config_error("topology: TP, DP, EP and PP must be >= 1");
    if ((tp * dp) % ep != 0)
      throw config_error(fmt::format("topology: EP={} does not divide the world size TP*DP={}", ep, tp * dp));
  }

  [[nodiscard]] constexpr std::size_t tp() const noexcept { return tp_.get(); }
  [[nodiscard]] constexpr std::size_t dp() const noexcept { return dp_.get(); }
  [[nodiscard]] constexpr std::size_t ep() const noexcept { return ep_.get(); }
  [[nodiscard]] constexpr std::size_t pp() const noexcept { return pp_.get(); }
  /// Ranks per pipeline stage: TP*DP.
  [[nodiscard]] constexpr std::size_t pp_stage_size() const noexcept { return tp() * dp(); }
  [[nodiscard]] constexpr std::size_t world_size() const noexcept { return pp_stage_size() * pp(); }

  /// Coordinates of global rank `r` (throws config_error when r is outside the world).
  [[nodiscard]] constexpr rank_coords coords(rank_t r) const {
    if (r >= world_size()) throw config_error(fmt::format("topology: rank {} outside a world of {}", r, world_size()));
    const std::size_t s = r % pp_stage_size();
    return {r, s % tp(), s / tp(), s % ep(), r / pp_stage_size()};
  }

  /// "tp1,dp8,ep8" (",pp2" appended when PP > 1)
  [[nodiscard]] std::string to_string() const {
    return pp() > 1 ? fmt::format("tp{},dp{},ep{},pp{}", tp(), dp(), ep(), pp())
                    : fmt::format("tp{},dp{},ep{}", tp(), dp(), ep());
  }

 private:
  [[no_unique_address]] detail::extent_store<TP, 0> tp_;
  [[no_unique_address]] detail::extent_store<DP, 1> dp_;
  [[no_unique_address]] detail::extent_store<EP, 2> ep_;
  [[no_unique_address]] detail::extent_store<PP, 3> pp_;
};

/// A topology type whose every size is static (`topology<1, 8, 8>`): what the
/// typed entry points take (plan_for, load_distributed).
template <class T>
concept static_topology = requires {
  { T::is_static } -> std::convertible_to<bool>;
  requires T::is_static;
};

/// Fully run-time topology.
using dynamic_topology = topology<dynamic, dynamic, dynamic, dynamic>;
/// The design's 8-GPU node: TP1/DP8/EP8.
using tp1_dp8_ep8 = topology<1, 8, 8>;
/// TP4 x PP2 on one 8-GPU node.
using tp4_pp2 = topology<4, 1, 1, 2>;

/// The four sizes of a topology string.
struct topology_sizes {
  std::size_t tp = 1, dp = 1, ep = 1, pp = 1;
  friend bool operator==(const topology_sizes&, const topology_sizes&) = default;
};

namespace detail {
// The parser's errors: not constexpr, so that a string literal they reject
// (topology_spec's consteval constructor) does not compile, the diagnostic
// naming the function; at run time they throw config_error.
[[noreturn]] inline void topology_syntax_error(std::string_view text, std::string_view part) {
  throw config_error(fmt::format("topology '{}': cannot parse '{}' (expected e.g. tp1,dp8,ep8 or tp4,pp2)", text, part));
}
[[noreturn]] inline void topology_size_error(const topology_sizes& z) {
  if (z.tp == 0 || z.dp == 0 || z.ep == 0 || z.pp == 0) throw config_error("topology: TP, DP, EP and PP must be >= 1");
  throw config_error(fmt::format("topology: EP={} does not divide the world size TP*DP={}", z.ep, z.tp * z.dp));
}
}  // namespace detail

/// The one topology parser, for compile time (topology_spec's literals) and
/// run time (parse_topology): "tp1,dp8,ep8" or "tp4,pp2" (any order; omitted
/// sizes are 1; spaces ignored). Throws config_error naming the bad part, or
/// the sizes that are not a topology (a size of 0, an EP that does not
/// divide TP*DP).
[[nodiscard]] constexpr topology_sizes parse_topology_sizes(std::string_view s) {
  if (!std::is_constant_evaluated()) detail::count_run_time_parse();
  topology_sizes z;
  const std::string_view text = s;
  while (!s.empty()) {
    const auto comma = s.find(',');
    auto part = s.substr(0, comma);
    s = comma == std::string_view::npos ? std::string_view{} : s.substr(comma + 1);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
    if (part.empty()) continue;
    std::size_t* dst = nullptr;
    if (part.starts_with("tp")) dst = &z.tp;
    else if (part.starts_with("dp")) dst = &z.dp;
    else if (part.starts_with("ep")) dst = &z.ep;
    else if (part.starts_with("pp")) dst = &z.pp;
    const auto digits = part.size() > 2 ? part.substr(2) : std::string_view{};
    if (!dst || digits.empty()) detail::topology_syntax_error(text, part);
    std::size_t v = 0;
    for (char ch : digits) {
      if (ch < '0' || ch > '9' || v > (~std::size_t{0} - 9) / 10) detail::topology_syntax_error(text, part);
      v = v * 10 + static_cast<std::size_t>(ch - '0');
    }
    *dst = v;
  }
  if (z.tp == 0 || z.dp == 0 || z.ep == 0 || z.pp == 0 || (z.tp * z.dp) % z.ep != 0) detail::topology_size_error(z);
  return z;
}

/// Parses a topology string (parse_topology_sizes) into a run-time topology.
/// Throws config_error naming the bad part.
[[nodiscard]] inline dynamic_topology parse_topology(std::string_view s) {
  const auto z = parse_topology_sizes(s);
  return dynamic_topology(z.tp, z.dp, z.ep, z.pp);
}

/// A topology where an API takes one as text ("tp1,dp8,ep8"): a string
/// literal is parsed at compile time (a literal that is not a topology does
/// not compile: the string API is the typed API, as fmt's format strings),
/// a static `topology<...>` gives its sizes with no parse at all, and a
/// run-time string is kept and parsed by the same parser when `sizes()` is
/// first asked (so its config_error surfaces where the API reads it, inside
/// the failure protocol of a distributed load). Refers to the text it was made
/// from (as a std::string_view): a parameter type, not for storing.
class topology_spec {
 public:
  /// A literal: parsed here, at compile time.
  template <std::size_t N>
  consteval topology_spec(const char (&literal)[N])  // NOLINT(google-explicit-constructor)
      : text_(literal, N - 1), sizes_(parse_topology_sizes(text_)), parsed_(true) {}
  /// A run-time string: parsed by sizes().
  constexpr topology_spec(std::string_view text) noexcept : text_(text) {}  // NOLINT(google-explicit-constructor)
  topology_spec(const std::string& text) noexcept : text_(text) {}         // NOLINT(google-explicit-constructor)
  /// A run-time C string (a template, so that a literal still takes the consteval constructor).
  template <class P>
    requires std::same_as<P, const char*> || std::same_as<P, char*>
  constexpr topology_spec(P text) noexcept : text_(text) {}  // NOLINT(google-explicit-constructor)
  /// A static topology: its sizes, no text to parse.
  template <std::size_t TP, std::size_t DP, std::size_t EP, std::size_t PP>
    requires policy::topology<TP, DP, EP, PP>::is_static
  constexpr topology_spec(const policy::topology<TP, DP, EP, PP>&) noexcept  // NOLINT(google-explicit-constructor)
      : sizes_{TP, DP, EP, PP}, parsed_(true) {}

  /// Whether the sizes are known without a run-time parse (a literal, a static topology).
  [[nodiscard]] constexpr bool parsed() const noexcept { return parsed_; }
  /// The sizes (a run-time string: parsed now; throws config_error).
  [[nodiscard]] constexpr topology_sizes sizes() const { return parsed_ ? sizes_ : parse_topology_sizes(text_); }
  /// The run-time topology.
  [[nodiscard]] dynamic_topology to_topology() const {
    const auto z = sizes();
    return dynamic_topology(z.tp, z.dp, z.ep, z.pp);
  }
  /// As given ("tp1,dp8,ep8"), or the static topology's to_string().
  [[nodiscard]] std::string text() const { return text_.empty() && parsed_ ? to_topology().to_string() : std::string(text_); }

 private:
  std::string_view text_;
  topology_sizes sizes_{};
  bool parsed_ = false;
};

}  // namespace sluice::inline v0::policy
