#pragma once
/// \file
/// Reader assignment balanced by bytes: each read goes to the least-loaded
/// eligible rank (ties to the lowest rank); callers feed reads largest first
/// (the LPT greedy, within 4/3 of optimal and much closer for many items).

#include <cstdint>
#include <limits>
#include <vector>

#include <sluice/error.hpp>
#include <sluice/policy/concepts.hpp>

namespace sluice::inline v0::policy {

/// Tracks bytes assigned per rank.
class reader_balancer {
 public:
  explicit reader_balancer(std::size_t world) : load_(world, 0) {}

  /// Charges `bytes` to the least-loaded rank of `eligible` and returns it.
  /// Throws config_error when `eligible` is empty.
  rank_t assign(const rank_set& eligible, std::uint64_t bytes) {
    rank_t best = 0;
    std::uint64_t best_load = std::numeric_limits<std::uint64_t>::max();
    for (std::size_t r = 0; r < load_.size(); ++r)
      if (eligible.contains(static_cast<rank_t>(r)) && load_[r] < best_load) best = static_cast<rank_t>(r), best_load = load_[r];
    if (best_load == std::numeric_limits<std::uint64_t>::max()) throw config_error("reader assignment: no eligible rank");
    load_[best] += bytes;
    return best;
  }
  /// Charges `bytes` to `r` (a forced reader).
  void charge(rank_t r, std::uint64_t bytes) { load_.at(r) += bytes; }
  /// Bytes per rank.
  [[nodiscard]] const std::vector<std::uint64_t>& loads() const noexcept { return load_; }

 private:
  std::vector<std::uint64_t> load_;
};

}  // namespace sluice::inline v0::policy
