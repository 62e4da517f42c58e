#pragma once
/// \file
/// Errors of the S3 source: every one names the endpoint, bucket, key, byte
/// range, HTTP status, S3 error code and how many attempts were made.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include <sluice/error.hpp>

namespace sluice::inline v0 {

/// Everything known about a failed S3 request.
struct s3_error_info {
  std::string operation;             ///< "GET", "HEAD", "ListObjectsV2", "PUT"
  std::string endpoint;              ///< e.g. "https://s3.us-east-1.amazonaws.com"
  std::string bucket;
  std::string key;                   ///< empty for bucket-level operations
  std::optional<byte_range> range;   ///< requested bytes, for range GETs
  unsigned http_status = 0;          ///< 0 when no response was received
  std::string s3_code;               ///< e.g. "NoSuchKey", "SlowDown"; or a transport error name
  std::string message;               ///< the server's <Message> or the transport error text
  unsigned attempt = 1;              ///< attempts made, including the failing one
  unsigned max_attempts = 1;         ///< the retry policy's limit
};

/// An S3 request failed. `what()` reads e.g.
/// "S3 GET failed: HTTP 404 NoSuchKey: The specified key does not exist.
///  [endpoint http://127.0.0.1:9000, bucket b, key k, attempt 1 of 5]
///  (file 's3://b/k', bytes [0, 100))".
class s3_error : public io_error {
 public:
  explicit s3_error(s3_error_info info, int code = 0)
      : io_error(compose(info), context_of(info), code), info_(std::move(info)) {}

  [[nodiscard]] const s3_error_info& info() const noexcept { return info_; }
  [[nodiscard]] const std::string& endpoint() const noexcept { return info_.endpoint; }
  [[nodiscard]] const std::string& bucket() const noexcept { return info_.bucket; }
  [[nodiscard]] const std::string& key() const noexcept { return info_.key; }
  [[nodiscard]] unsigned http_status() const noexcept { return info_.http_status; }
  [[nodiscard]] const std::string& s3_code() const noexcept { return info_.s3_code; }
  [[nodiscard]] unsigned attempts() const noexcept { return info_.attempt; }

 private:
  static std::string compose(const s3_error_info& i) {
    std::string s = fmt::format("S3 {} failed: ", i.operation);
    if (i.http_status != 0) s += fmt::format("HTTP {} ", i.http_status);
    s += i.s3_code.empty() ? std::string("(no S3 error code)") : i.s3_code;
    if (!i.message.empty()) s += ": " + i.message;
    s += fmt::format(" [endpoint {}, bucket {}", i.endpoint, i.bucket.empty() ? "-" : i.bucket);
    if (!i.key.empty()) s += fmt::format(", key {}", i.key);
    if (i.range) s += fmt::format(", range bytes={}-{}", i.range->begin, i.range->end == 0 ? 0 : i.range->end - 1);
    s += fmt::format(", attempt {} of {}]", i.attempt, i.max_attempts);
    return s;
  }
  static error_context context_of(const s3_error_info& i) {
    error_context c;
    if (!i.bucket.empty()) c.file = "s3://" + i.bucket + "/" + i.key;
    c.range = i.range;
    return c;
  }
  s3_error_info info_;
};

/// 404: NoSuchKey, NoSuchBucket, NotFound. Never retried.
class s3_not_found_error : public s3_error {
 public:
  using s3_error::s3_error;
};

/// 403: AccessDenied, SignatureDoesNotMatch, InvalidAccessKeyId,
/// ExpiredToken... Never retried.
class s3_access_error : public s3_error {
 public:
  using s3_error::s3_error;
};

/// The object changed since it was first seen (its ETag differs, or a range GET
/// with If-Match got 412 PreconditionFailed). Never retried: mixing bytes of
/// two versions of a checkpoint is worse than failing.
class s3_object_changed_error : public s3_error {
 public:
  using s3_error::s3_error;
};

}  // namespace sluice::inline v0
