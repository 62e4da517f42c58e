#pragma once
/// \file
/// Vocabulary of placement: ranks, rank sets, tensor classes, destinations,
/// and the `placement_policy` concept. Pure: no I/O, no Asio.

#include <algorithm>
#include <atomic>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <sluice/error.hpp>

namespace sluice::inline v0::policy {

/// `std::dynamic_extent`: a topology size known only at run time.
inline constexpr std::size_t dynamic = std::dynamic_extent;

namespace detail {
// Run-time parses of topology and offload text (parse_topology_sizes,
// parse_offload outside constant evaluation): a testing hook, read by
// run_time_parses().
inline std::atomic<std::uint64_t> run_time_parse_count{0};
inline void count_run_time_parse() noexcept { run_time_parse_count.fetch_add(1, std::memory_order_relaxed); }
}  // namespace detail

/// How many topology and offload strings this process has parsed at run
/// time (a literal is parsed at compile time; a static topology or an
/// offload strategy type is never parsed). For tests: the typed path does
/// not move it.
[[nodiscard]] inline std::uint64_t run_time_parses() noexcept {
  return detail::run_time_parse_count.load(std::memory_order_relaxed);
}

/// A global rank in [0, world size).
using rank_t = std::uint32_t;

/// A set of ranks (a bit set sized to the world). Iterates in rank order.
class rank_set {
 public:
  rank_set() = default;
  /// The empty set over `world` ranks.
  explicit rank_set(std::size_t world) : words_((world + 63) / 64, 0), world_(world) {}
  /// Every rank of `world`.
  [[nodiscard]] static rank_set all(std::size_t world) {
    rank_set s(world);
    for (std::size_t r = 0; r < world; ++r) s.insert(static_cast<rank_t>(r));
    return s;
  }
  void insert(rank_t r) { words_.at(r / 64) |= std::uint64_t{1} << (r % 64); }
  [[nodiscard]] bool contains(rank_t r) const noexcept {
    return r < world_ && (words_[r / 64] >> (r % 64)) & 1u;
  }
  [[nodiscard]] std::size_t size() const noexcept {
    std::size_t n = 0;
    for (auto w : words_) n += static_cast<std::size_t>(std::popcount(w));
    return n;
  }
  [[nodiscard]] bool empty() const noexcept { return size() == 0; }
  [[nodiscard]] std::size_t world() const noexcept { return world_; }
  /// The members in increasing order.
  [[nodiscard]] std::vector<rank_t> members() const {
    std::vector<rank_t> m;
    for (std::size_t r = 0; r < world_; ++r)
      if (contains(static_cast<rank_t>(r))) m.push_back(static_cast<rank_t>(r));
    return m;
  }
  friend bool operator==(const rank_set&, const rank_set&) = default;

 private:
  std::vector<std::uint64_t> words_;
  std::size_t world_ = 0;
};

/// What a tensor is, for placement.
enum class tensor_class : std::uint8_t {
  replicated,     ///< every data-parallel replica needs it (attention, dense MLP, shared experts, norms, ...)
  routed_expert,  ///< one routed expert's weight: owned by one expert-parallel rank
  shared_table,   ///< a huge CPU table (e.g. Engram): offloaded per the offload strategy
};

[[nodiscard]] constexpr std::string_view class_name(tensor_class c) noexcept {
  switch (c) {
    case tensor_class::replicated: return "replicated";
    case tensor_class::routed_expert: return "routed_expert";
    case tensor_class::shared_table: return "shared_table";
  }
  return "?";
}

/// How the TP ranks of a stage share a tensor (TP > 1).
enum class tp_split : std::uint8_t {
  none,     ///< every owner keeps the whole tensor
  rows,     ///< dim 0: TP rank k keeps rows [k R/TP, (k+1) R/TP): one contiguous byte range
            ///< (the output dim of a column-parallel linear: q/k/v, gate/up, vocabulary)
  columns,  ///< dim 1: TP rank k keeps columns [k C/TP, (k+1) C/TP) of every row: strided in
            ///< the file (the input dim of a row-parallel linear: o_proj, down_proj). Planned
            ///< as reads of whole rows, sliced in the reader's buffer (bench-tp-slices)
};

[[nodiscard]] constexpr std::string_view split_name(tp_split s) noexcept {
  switch (s) {
    case tp_split::none: return "none";
    case tp_split::rows: return "rows";
    case tp_split::columns: return "columns";
  }
  return "?";
}

/// Where a rank keeps a tensor.
enum class destination : std::uint8_t {
  none,         ///< this rank does not own the tensor
  device,       ///< the rank's accelerator memory
  host,         ///< rank-local host memory
  shared_host,  ///< the node's shared host segment (one copy per node)
};

[[nodiscard]] constexpr std::string_view destination_name(destination d) noexcept {
  switch (d) {
    case destination::none: return "none";
    case destination::device: return "device";
    case destination::host: return "host";
    case destination::shared_host: return "shared_host";
  }
  return "?";
}

/// What a placement policy knows about a tensor: its name, size and shape
/// (metadata only) plus the class the classifier gave it.
struct tensor_info {
  std::string name;
  std::uint64_t size = 0;               ///< bytes
  std::vector<std::uint64_t> shape;
  tensor_class cls = tensor_class::replicated;
  std::int64_t expert = -1;             ///< routed experts: the expert index, else -1
  std::int64_t layer = -1;              ///< the layer index parsed from the name, else -1 (pipeline stages)

  /// Metadata of a checkpoint tensor (a tensor_ref; class filled in by a
  /// classifier). A template, so that placement stays free of the checkpoint's
  /// I/O headers (the name fuzz target compiles it without Asio).
  template <class TensorRef>
  [[nodiscard]] static tensor_info from(const TensorRef& t) {
    return {t.name, t.size, t.shape};
  }
};

}  // namespace sluice::inline v0::policy
