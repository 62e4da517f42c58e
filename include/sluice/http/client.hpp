#pragma once
/// \file
/// An asynchronous HTTP/1.1 client for object stores: a keep-alive connection
/// pool, TLS, range GETs read straight into caller memory, resumed at the
/// first missing byte, their Content-Range and ETag checked, retries with
/// capped jittered backoff, a low-speed floor, cancellation. What a store adds
/// comes with each request (request_hooks): how an attempt is signed, how a
/// failed answer reads, which typed error a request that failed for good
/// throws. S3 (s3/client.hpp) is one such store. Boost.Beast does the HTTP in
/// src/http/ only: this header has no Beast.

#include <utility>   // before Asio (Boost 1.74)

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/any_io_executor.hpp>

#include <sluice/core/task.hpp>
#include <sluice/http/endpoint.hpp>
#include <sluice/http/retry.hpp>
#include <sluice/source/concepts.hpp>

namespace sluice::inline v0::http {

using header_list = std::vector<std::pair<std::string, std::string>>;

/// How a client reaches its endpoint (a store's config fills it).
struct client_options {
  http::endpoint endpoint;
  bool verify_tls = true;                              ///< verify the server certificate and host name
  std::string ca_bundle;                               ///< PEM file of trusted CAs; empty: the system store
  std::size_t max_connections = 16;                    ///< pool size: requests in flight at once
  std::chrono::milliseconds connect_timeout{10'000};   ///< TCP connect + TLS handshake
  /// A response that delivers fewer than `low_speed_limit` bytes/s over
  /// `low_speed_window` (or nothing at all for a window, headers included)
  /// is abandoned and retried.
  std::uint64_t low_speed_limit = 64 * 1024;
  std::chrono::milliseconds low_speed_window{10'000};
  retry_policy retry;
  /// Appended to a TLS handshake failure's message when no CA bundle is set
  /// (how the store's users name one: "set AWS_CA_BUNDLE ...").
  std::string ca_hint;
};

/// One logical request: retried as a whole, or, a range GET, resumed at the
/// first byte not yet received.
struct request {
  std::string operation;            ///< the store's name for it, in messages ("GET", "ListObjectsV2")
  std::string method = "GET";       ///< "GET", "HEAD" or "PUT"
  std::string host;                 ///< the host name to connect to (a store may use one per bucket)
  std::string body;                 ///< sent as is (PUT)
  /// A range GET of bytes [begin, end) into `dst` (end clipped to the
  /// object's size by the answer).
  bool ranged = false;
  std::uint64_t begin = 0, end = 0;
  std::byte* dst = nullptr;
  /// Sent as If-Match. Empty: a range GET pins the ETag of its first answer,
  /// so that a resumed request reads the same version.
  std::string if_match;
};

/// One attempt as it goes on the wire, made by request_hooks::prepare.
struct wire_request {
  std::string target = "/";   ///< the request target: encoded path and query
  header_list headers;        ///< lower-case names; the client adds User-Agent and keep-alive
};

/// What a completed attempt answered.
struct response {
  unsigned status = 0;
  std::string etag;
  std::optional<std::uint64_t> content_length;
  std::uint64_t object_size = 0;   ///< range GET: from Content-Range; HEAD: Content-Length
  std::string body;                ///< small bodies only (listings, error documents)
};

/// A failed attempt, before the retry decision.
struct failure {
  unsigned status = 0;      ///< 0: no answer (transport)
  std::string code;         ///< the store's error code, or the transport's ("ConnectionReset", "LowSpeed")
  std::string message;
  bool retryable = false;
  bool changed = false;     ///< the object is not the version asked for (If-Match, a new ETag)
  int ec = 0;               ///< errno-like value, where there is one
};

/// What a store adds to each request.
struct request_hooks {
  /// Makes one attempt's wire form: given the headers the client sets
  /// ("host", "range", "if-match"), fills `w` (target, and signs: every
  /// attempt anew, since the time and the range change).
  std::function<void(const request&, const header_list& headers, wire_request& w)> prepare;
  /// A completed answer other than 2xx (and 416 for a range GET): what
  /// failed, and whether to retry; nullopt: a success after all (S3's
  /// BucketAlreadyOwnedByYou).
  std::function<std::optional<failure>(const request&, const response&)> classify;
  /// Throws the store's typed error for a request that failed for good
  /// (`attempt` of the policy's max, after `progress` bytes of a range GET).
  std::function<void(const request&, const failure&, unsigned attempt, std::size_t progress)> fail;
  /// The request's resource in messages ("bucket b, key k").
  std::function<std::string(const request&)> describe;
  /// The store's name in messages ("S3").
  std::string store = "HTTP";
};

/// What a request that succeeded answered, and how many attempts it took.
struct result {
  response answer;
  unsigned attempts = 1;
  std::size_t bytes = 0;   ///< range GET: bytes written to dst
};

/// An HTTP client bound to an executor. Its coroutines run there; it must
/// outlive every request it started. Thread-safe.
class client {
 public:
  client(asio::any_io_executor ex, client_options opt);
  ~client();
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  [[nodiscard]] const client_options& options() const noexcept;
  [[nodiscard]] asio::any_io_executor get_executor() const noexcept;
  /// Requests, retries, payload bytes received, over the client's life.
  [[nodiscard]] const io_counters& counters() const noexcept;
  /// The same, for a store to count what it does (objects opened).
  [[nodiscard]] io_counters& counters() noexcept;
  /// Connections idle in the pool / checked out now.
  [[nodiscard]] std::size_t idle_connections() const;
  [[nodiscard]] std::size_t busy_connections() const;

  /// Ends every request in flight (their sockets are shut down) and every
  /// later one with cancelled_error naming it; nothing is retried.
  /// Thread-safe. Permanent.
  void cancel();
  [[nodiscard]] bool cancelled() const noexcept;

  /// Runs `r` with `hooks` (see request_hooks), retrying transient failures
  /// (transport errors, a truncated or stalled body, what `classify` calls
  /// retryable) per the policy; a range GET resumes at its first missing
  /// byte. Throws what `fail` throws, or cancelled_error.
  /// A range GET's `dst` must stay valid until the task completes.
  [[nodiscard]] task<result> execute(request r, const request_hooks& hooks);

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace sluice::inline v0::http
