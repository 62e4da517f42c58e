#pragma once
/// \file
/// The node-local cache's options (cache/block_cache.hpp): light enough for
/// every source's configuration to carry.

#include <cstdint>
#include <functional>
#include <string>

namespace sluice::inline v0::cache {

/// Blocks are 16 MiB unless told otherwise (the last of an object shorter).
inline constexpr std::uint64_t default_block_size = std::uint64_t{16} << 20;

/// Where the cache is and how large it may grow.
struct options {
  std::string dir;                                  ///< empty: no cache
  std::uint64_t max_bytes = 0;                      ///< cap on the blocks' bytes (0: none)
  std::uint64_t block_size = default_block_size;    ///< a multiple of 4096
  /// Where the cache reports what it discards (bad blocks, refused writes);
  /// stderr when empty.
  std::function<void(const std::string&)> warn;
};

}  // namespace sluice::inline v0::cache
