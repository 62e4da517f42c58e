#pragma once
/// \file
/// An asynchronous S3 client: range GETs straight into caller memory, HEAD,
/// ListObjectsV2, PUT; SigV4, HTTPS, a keep-alive connection pool, retries with
/// capped jittered backoff, ETag pinning. The HTTP is the HTTP room's client
/// (http/client.hpp, Boost.Beast in src/http); what is S3's (addressing,
/// signing each attempt, error documents, typed errors) is src/s3/client.cpp.

#include <utility>   // before Asio (Boost 1.74)

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>

#include <sluice/core/task.hpp>
#include <sluice/source/concepts.hpp>
#include <sluice/s3/config.hpp>
#include <sluice/s3/error.hpp>
#include <sluice/s3/listing.hpp>

namespace sluice::inline v0::s3 {

/// What HEAD says about an object.
struct object_info {
  std::uint64_t size = 0;
  std::string etag;   ///< as sent by the server, quotes included
};

/// The outcome of a range GET.
struct range_result {
  std::size_t bytes = 0;           ///< bytes written to the destination (fewer than asked only at end of object)
  std::uint64_t object_size = 0;   ///< the whole object's size (from Content-Range)
  std::string etag;                ///< the object's ETag
  unsigned attempts = 1;           ///< requests made (1 + retries)
};

/// An S3 client bound to an executor. All coroutines run on that executor;
/// the client is thread-safe, but the usual use is one strand or one thread.
/// It must outlive every operation it started (co_await them all before
/// destroying it). Operations are not cancellable individually (Boost 1.74 has
/// no cancellation slots); their time is bounded by the connect timeout, the
/// low-speed window and the retry policy.
///
/// Errors: s3_not_found_error (404), s3_access_error (403, e.g.
/// SignatureDoesNotMatch), s3_object_changed_error (ETag mismatch / 412) are
/// never retried; everything transient (500/502/503/504, SlowDown, reset,
/// truncated body, stalls) is retried per `config::retry`, then thrown as
/// s3_error. Every message names endpoint, bucket, key, range, HTTP status, S3
/// code and attempt count.
class client {
 public:
  client(asio::any_io_executor ex, config cfg);
  ~client();
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  [[nodiscard]] const s3::config& cfg() const noexcept;
  [[nodiscard]] asio::any_io_executor get_executor() const noexcept;
  /// Requests, retries, bytes received (payload) over the client's life.
  [[nodiscard]] const io_counters& counters() const noexcept;
  /// Connections currently idle in the pool (for leak checks in tests).
  [[nodiscard]] std::size_t idle_connections() const;
  /// Connections currently checked out (0 when no operation is in flight).
  [[nodiscard]] std::size_t busy_connections() const;

  /// Cancels every operation, now and from now on: requests in flight end
  /// within moments (their sockets are shut down) and with cancelled_error
  /// naming the request, as does any later one; nothing is retried. Thread-safe
  /// (call it from a stop callback). A request still connecting ends when the
  /// connect does (at most config::connect_timeout). Permanent for this client.
  void cancel();
  [[nodiscard]] bool cancelled() const noexcept;

  /// HEAD: size and ETag.
  [[nodiscard]] task<object_info> head(std::string bucket, std::string key);

  /// Range GET of [offset, offset + dst.size()) into `dst`; the body is read
  /// with large reads straight into `dst` (no intermediate buffer beyond the few
  /// body bytes that arrive with the headers). Content-Range and the length are
  /// verified. With a non-empty `if_match` every request carries If-Match and a
  /// response with another ETag is an s3_object_changed_error; without one,
  /// resumed requests pin the ETag of the first response. A truncated or stalled
  /// body is resumed from the first missing byte. Returns fewer bytes only at
  /// the end of the object (0 when `offset` is at or past it).
  /// `dst` must stay valid until the task completes.
  [[nodiscard]] task<range_result> get_range(std::string bucket, std::string key, std::uint64_t offset,
                                             std::span<std::byte> dst, std::string if_match = {});

  /// ListObjectsV2 under `prefix`, following continuation tokens. With a
  /// `delimiter` ("/"), keys below the next delimiter are rolled up into
  /// common_prefixes.
  [[nodiscard]] task<list_result> list(std::string bucket, std::string prefix, std::string delimiter = {},
                                       unsigned max_keys = 1000);

  /// PUT of a whole object (signed payload); returns its ETag. For tests and tools.
  /// `body` must stay valid until the task completes.
  [[nodiscard]] task<std::string> put(std::string bucket, std::string key, std::span<const std::byte> body);

  /// PUT bucket (CreateBucket); succeeds if the bucket already exists and is ours.
  [[nodiscard]] task<void> create_bucket(std::string bucket);

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace sluice::inline v0::s3
