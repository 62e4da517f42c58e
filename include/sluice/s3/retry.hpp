#pragma once
/// \file
/// When and how long to wait before retrying an S3 request: capped, jittered
/// exponential backoff on transient failures (HTTP 500/502/503/504, SlowDown,
/// connection reset or refused, truncated bodies, stalls).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string_view>

namespace sluice::inline v0::s3 {

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

/// True for the HTTP statuses and S3 error codes that are worth retrying.
[[nodiscard]] inline bool is_retryable(unsigned http_status, std::string_view s3_code) noexcept {
  if (s3_code == "SlowDown" || s3_code == "InternalError" || s3_code == "ServiceUnavailable" ||
      s3_code == "RequestTimeout" || s3_code == "RequestTimeTooSkewed")
    return true;
  return http_status == 500 || http_status == 502 || http_status == 503 || http_status == 504 ||
         http_status == 429;
}

}  // namespace sluice::inline v0::s3
