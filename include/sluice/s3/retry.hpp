#pragma once
/// \file
/// Which S3 answers are worth retrying: the HTTP room's transient statuses
/// (http/retry.hpp, with its backoff policy) plus S3's own error codes.

#include <string_view>

#include <sluice/http/retry.hpp>

namespace sluice::inline v0::s3 {

/// The backoff policy (the HTTP room's).
using retry_policy = http::retry_policy;

/// True for the HTTP statuses and S3 error codes that are worth retrying.
[[nodiscard]] inline bool is_retryable(unsigned http_status, std::string_view s3_code) noexcept {
  if (s3_code == "SlowDown" || s3_code == "InternalError" || s3_code == "ServiceUnavailable" ||
      s3_code == "RequestTimeout" || s3_code == "RequestTimeTooSkewed")
    return true;
  return http::is_retryable_status(http_status);
}

}  // namespace sluice::inline v0::s3
