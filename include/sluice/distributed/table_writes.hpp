#pragma once
/// \file
/// A rank's share of the node's shared tables written from the page cache
/// into the segment (the driver's tables phase, memory::shared_host::write):
/// the slices, and how they are dealt to the rank's writer threads.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include <sluice/checkpoint.hpp>

namespace sluice::inline v0::detail {

/// A slice of a shared table a rank writes into the node's segment from the
/// page cache: bytes [offset, offset + size) of tensor `t`, at `at` in the
/// segment.
struct table_write {
  const tensor_ref* t = nullptr;
  std::uint64_t offset = 0, size = 0, at = 0;
  friend bool operator==(const table_write&, const table_write&) = default;
};

/// `writes` cut at the segment's piece starts (`pieces`: ascending, the first
/// 0) and dealt to at most `threads` lanes (at least one), pieces in turn, a
/// piece's parts all in one lane: one thread per piece, as far as the
/// threads go, and never two threads in one piece (shmem's write path holds
/// the piece's inode lock). Cut, since a rank's share of one table spans all
/// its pieces, and uncut it would be one thread's work.
[[nodiscard]] inline std::vector<std::vector<table_write>> table_lanes(std::span<const table_write> writes,
                                                                        std::span<const std::uint64_t> pieces,
                                                                        std::size_t threads) {
  std::map<std::size_t, std::vector<table_write>> by_piece;
  for (const auto& w : writes)
    for (std::uint64_t b = w.at, end = w.at + w.size; b < end;) {
      const auto i = pieces.empty() ? 0
                                    : static_cast<std::size_t>(std::upper_bound(pieces.begin(), pieces.end(), b) - pieces.begin() - 1);
      const auto stop = i + 1 < pieces.size() ? std::min(end, pieces[i + 1]) : end;
      by_piece[i].push_back({w.t, w.offset + (b - w.at), stop - b, b});
      b = stop;
    }
  std::vector<std::vector<table_write>> lanes(std::min(by_piece.size(), std::max<std::size_t>(1, threads)));
  std::size_t k = 0;
  for (auto& [piece, parts] : by_piece) {
    auto& lane = lanes[k++ % lanes.size()];
    lane.insert(lane.end(), parts.begin(), parts.end());
  }
  return lanes;
}

}  // namespace sluice::inline v0::detail
