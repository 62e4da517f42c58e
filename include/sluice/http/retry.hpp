#pragma once
/// \file
/// When and how long to wait before retrying an HTTP request to an object
/// store: capped, jittered exponential backoff on transient failures (HTTP
/// 429/500/502/503/504, connection reset or refused, truncated bodies,
/// stalls). A store's own error codes (S3's SlowDown...) are its room's
/// (s3/retry.hpp).

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace sluice::inline v0::http {

/// Retry knobs (CUB-style: a struct of plain values).
struct retry_policy {
  unsigned max_attempts = 5;                        ///< attempts in all, including the first
  std::chrono::milliseconds base_delay{100};        ///< delay scale of the first retry
  std::chrono::milliseconds max_delay{5000};        ///< cap of any single delay

  /// The delay before attempt `attempt + 1` after `attempt` failed (attempt >= 1):
  /// "equal jitter" - half of min(max_delay, base_delay * 2^(attempt-1)) plus a
  /// uniformly random part of the other half, taken from `random`.
  [[nodiscard]] std::chrono::milliseconds backoff(unsigned attempt, std::uint64_t random) const noexcept {
    const unsigned shift = std::min(attempt == 0 ? 0u : attempt - 1, 20u);
    const auto exp = std::min<std::int64_t>(max_delay.count(), base_delay.count() << shift);
    const auto half = exp / 2;
    return std::chrono::milliseconds(half + (half > 0 ? static_cast<std::int64_t>(random % static_cast<std::uint64_t>(half + 1)) : 0));
  }
};

/// True for the HTTP statuses worth retrying whatever the store.
[[nodiscard]] constexpr bool is_retryable_status(unsigned status) noexcept {
  return status == 500 || status == 502 || status == 503 || status == 504 || status == 429;
}

}  // namespace sluice::inline v0::http
