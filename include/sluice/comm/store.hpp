#pragma once
/// \file
/// Rank identity and rendezvous settings from the environment, as launchers
/// set them: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (torchrun) and
/// SLUICE_STORE_DIR (the file-store directory on one node, created and
/// emptied by `sluice-launch`), SLUICE_COMM_TIMEOUT_MS.
///
/// Only a file store is supported for now (one node, or a shared filesystem
/// for several); MASTER_ADDR/MASTER_PORT would need a TCP store (issue 5).

#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>

#include <fmt/format.h>

#include <sluice/error.hpp>

namespace sluice::inline v0::comm {

/// Who this process is and how it meets its peers.
struct rank_info {
  std::size_t rank = 0;
  std::size_t world_size = 1;
  std::size_t local_rank = 0;
  std::size_t local_size = 1;   ///< ranks on this node
  std::string store_dir;         ///< file-store directory (empty: none)
  std::chrono::milliseconds timeout{60000};  ///< per collective and for rendezvous

  /// Reads the variables above (missing: a one-rank world). Throws config_error for malformed values.
  [[nodiscard]] static rank_info from_env() {
    rank_info r;
    auto num = [](const char* name, std::size_t def) -> std::size_t {
      const char* v = std::getenv(name);
      if (!v || !*v) return def;
      char* end = nullptr;
      const auto x = std::strtoull(v, &end, 10);
      if (*end) throw config_error(fmt::format("environment variable {}='{}' is not a number", name, v));
      return static_cast<std::size_t>(x);
    };
    r.rank = num("RANK", 0);
    r.world_size = num("WORLD_SIZE", 1);
    r.local_rank = num("LOCAL_RANK", r.rank);
    r.local_size = num("LOCAL_WORLD_SIZE", r.world_size);
    r.timeout = std::chrono::milliseconds(num("SLUICE_COMM_TIMEOUT_MS", 60000));
    if (const char* d = std::getenv("SLUICE_STORE_DIR")) r.store_dir = d;
    if (r.rank >= r.world_size) throw config_error(fmt::format("RANK={} is not below WORLD_SIZE={}", r.rank, r.world_size));
    return r;
  }
};

}  // namespace sluice::inline v0::comm
