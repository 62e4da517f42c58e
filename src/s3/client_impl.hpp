// The S3 client's implementation (client.cpp, client_tls.cpp): the only
// headers of sluice that include Boost.Beast, private to src/s3. An attempt
// over a stream (client::impl::attempt_on) is defined in client_attempt.hpp
// and instantiated once per stream type, each in its own unit, so that no
// unit of the ASan build compiles both Beast paths (plain TCP and TLS).
#pragma once

#include <utility>   // before Asio (Boost 1.74)

#include <sluice/s3/client.hpp>
#include <sluice/http/connection_pool.hpp>

#include "../http/range_answer.hpp"
#include "xml.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstring>
#include <iterator>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <set>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <openssl/err.h>

namespace sluice::inline v0::s3 {

namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using clock_type = std::chrono::steady_clock;

namespace client_detail {

inline constexpr std::size_t header_buffer_size = 16 * 1024;        // headers + first body bytes
inline constexpr std::uint64_t max_small_body = 64ull * 1024 * 1024;  // listings, error documents

/// One keep-alive connection to one host.
struct connection {
  std::string host;   ///< the host name it is connected to (virtual-hosted: per bucket)
  std::optional<beast::tcp_stream> plain;
  std::optional<ssl::stream<beast::tcp_stream>> tls;
  beast::flat_buffer buffer;
  beast::tcp_stream& lowest() { return tls ? beast::get_lowest_layer(*tls) : *plain; }
};

/// A failed attempt, before the retry decision.
struct attempt_failure {
  unsigned status = 0;
  std::string code;
  std::string message;
  bool retryable = false;
  bool changed = false;   // ETag mismatch / 412
  int ec = 0;
};

/// One logical request (retried as a whole, or resumed for range GETs).
struct op {
  std::string name;   // "GET", "HEAD", "ListObjectsV2", "PUT", "CreateBucket"
  http::verb method = http::verb::get;
  std::string bucket, key;
  std::vector<std::pair<std::string, std::string>> query;
  std::string body;   // PUT
  bool ranged = false;
  std::uint64_t begin = 0, end = 0;   // requested [begin, end) for range GETs
  std::byte* dst = nullptr;
  std::string if_match;
};

/// What a successful attempt learned.
struct response {
  unsigned status = 0;
  std::string etag;
  std::optional<std::uint64_t> content_length;
  std::uint64_t object_size = 0;
  std::string body;   // small bodies (listings, PUT responses)
};

inline std::string_view sv(beast::string_view s) { return {s.data(), s.size()}; }

inline std::string transport_code(const boost::system::error_code& ec, std::string_view phase) {
  if (ec == beast::error::timeout) return phase == "connect" ? "ConnectTimeout" : "Timeout";
  if (ec == asio::error::connection_reset) return "ConnectionReset";
  if (ec == asio::error::connection_refused) return "ConnectionRefused";
  if (ec == asio::error::broken_pipe) return "BrokenPipe";
  if (ec.category() == asio::error::get_ssl_category() || ec == ssl::error::stream_truncated)
    return phase == "handshake" ? "TLSHandshakeFailed" : "TLSError";
  if (ec == asio::error::eof || ec == http::error::end_of_stream || ec == http::error::partial_message)
    return phase == "body" ? "TruncatedBody" : "ConnectionClosed";
  if (ec.category() == asio::error::get_netdb_category() || ec.category() == asio::error::get_addrinfo_category())
    return "NameResolutionFailed";
  return "TransportError";
}

}  // namespace client_detail
using namespace client_detail;

struct client::impl {
  impl(asio::any_io_executor e, config c)
      : ex(std::move(e)), cfg(std::move(c)), pool(cfg.max_connections), tls_ctx(ssl::context::tls_client) {
    if (cfg.endpoint.tls()) {
      if (cfg.verify_tls) {
        tls_ctx.set_verify_mode(ssl::verify_peer);
        if (!cfg.ca_bundle.empty()) {
          boost::system::error_code ec;
          tls_ctx.load_verify_file(cfg.ca_bundle, ec);
          if (ec) throw config_error(fmt::format("cannot load CA bundle '{}': {}", cfg.ca_bundle, ec.message()));
        } else {
          tls_ctx.set_default_verify_paths();
        }
      } else {
        tls_ctx.set_verify_mode(ssl::verify_none);
      }
    }
  }

  asio::any_io_executor ex;
  config cfg;
  sluice::http::connection_pool<connection> pool;
  ssl::context tls_ctx;
  io_counters counters;
  // Cancellation (client::cancel, from any thread): the flag stops new
  // attempts and retries; the sockets of attempts in flight are shut down
  // (shutdown(2) on the descriptor: thread-safe, wakes a pending read with
  // EOF, and leaves closing to the coroutine that owns the socket).
  std::atomic<bool> cancelled{false};
  std::mutex active_mutex;
  std::multiset<int> active_fds;
  std::mutex rng_mutex;
  std::mt19937_64 rng{std::random_device{}()};

  std::uint64_t random() {
    std::lock_guard lock(rng_mutex);
    return rng();
  }

  std::string host_for(const std::string& bucket) const {
    if (bucket.empty() || cfg.use_path_style(bucket)) return cfg.endpoint.host;
    return bucket + "." + cfg.endpoint.host;
  }
  std::string path_for(const std::string& bucket, const std::string& key) const {
    if (bucket.empty()) return "/";
    if (cfg.use_path_style(bucket)) return "/" + bucket + (key.empty() ? "" : "/" + key);
    return "/" + key;
  }

  [[nodiscard]] task<void> connect(connection& c, std::string host, std::string& phase) {
    c.host = host;
    c.buffer.clear();
    c.buffer.reserve(header_buffer_size);
    phase = "resolve";
    tcp::resolver resolver(ex);
    auto results = co_await resolver.async_resolve(host, std::to_string(cfg.endpoint.port), asio::use_awaitable);
    phase = "connect";
    if (cfg.endpoint.tls()) {
      c.tls.emplace(ex, tls_ctx);
      if (cfg.verify_tls) c.tls->set_verify_callback(ssl::host_name_verification(host));
      boost::system::error_code not_an_ip;
      (void)asio::ip::make_address(host, not_an_ip);
      if (not_an_ip) {
        // A host name (not an IP literal): send SNI.
        if (!::SSL_set_tlsext_host_name(c.tls->native_handle(), host.c_str()))
          throw boost::system::system_error(static_cast<int>(::ERR_get_error()), asio::error::get_ssl_category());
      }
      c.lowest().expires_after(cfg.connect_timeout);
      co_await c.lowest().async_connect(results, asio::use_awaitable);
      c.lowest().socket().set_option(tcp::no_delay(true));
      phase = "handshake";
      c.lowest().expires_after(cfg.connect_timeout);
      co_await c.tls->async_handshake(ssl::stream_base::client, asio::use_awaitable);
    } else {
      c.plain.emplace(ex);
      c.lowest().expires_after(cfg.connect_timeout);
      co_await c.lowest().async_connect(results, asio::use_awaitable);
      c.lowest().socket().set_option(tcp::no_delay(true));
    }
    c.lowest().expires_never();
  }

  /// Reads raw body bytes into [p, p + n) with low-speed detection; `progress`
  /// counts what has arrived (kept across a failure for resumption). Defined in
  /// client_attempt.hpp, instantiated per stream type in its own unit.
  template <class Stream>
  [[nodiscard]] task<void> read_body_into(Stream& s, connection& c, std::byte* p, std::uint64_t n,
                                          std::size_t& progress);

  /// One attempt of `o` on connection `c` over stream `s` (client_attempt.hpp).
  template <class Stream>
  [[nodiscard]] task<response> attempt_on(Stream& s, connection& c, op& o, std::size_t& progress,
                                          std::string& phase);

  /// A response that completed but closes the connection (not an error).
  struct keep_alive_off {
    response r;
  };

  /// One attempt on a pooled connection. Returns the response or throws attempt_failure.
  // Registers a connected socket as in flight for the attempt's duration
  // (declared after the lease, so it deregisters before the socket closes).
  class in_flight {
   public:
    in_flight(impl& i, int fd) : impl_(&i), fd_(fd) {
      std::lock_guard lock(impl_->active_mutex);
      impl_->active_fds.insert(fd_);
    }
    ~in_flight() {
      std::lock_guard lock(impl_->active_mutex);
      impl_->active_fds.erase(impl_->active_fds.find(fd_));
    }
    in_flight(const in_flight&) = delete;
    in_flight& operator=(const in_flight&) = delete;

   private:
    impl* impl_;
    int fd_;
  };

  void cancel() {
    cancelled = true;
    std::lock_guard lock(active_mutex);
    for (int fd : active_fds) ::shutdown(fd, SHUT_RDWR);
  }

  [[noreturn]] void throw_cancelled(const op& o) const {
    throw cancelled_error(fmt::format("S3 {} cancelled (endpoint {}, bucket {}, key {}{})", o.name, cfg.endpoint.url(), o.bucket,
                                      o.key, o.ranged ? fmt::format(", bytes={}-{}", o.begin, o.end - 1) : ""));
  }

  [[nodiscard]] task<response> attempt(op& o, std::size_t& progress) {
    auto lease = co_await pool.acquire();
    if (cancelled) throw_cancelled(o);
    std::string phase = "connect";
    const std::string host = host_for(o.bucket);
    const bool reused = lease.conn && lease.conn->host == host;
    std::optional<in_flight> registered;
    try {
      if (!reused) {
        lease.conn = std::make_unique<connection>();
        co_await connect(*lease.conn, host, phase);
      }
      connection& c = *lease.conn;
      registered.emplace(*this, c.lowest().socket().native_handle());
      if (cancelled) throw_cancelled(o);  // a cancel() before the registration saw no socket
      response r;
      bool reusable = true;
      try {
        if (c.tls)
          r = co_await attempt_on(*c.tls, c, o, progress, phase);
        else
          r = co_await attempt_on(*c.plain, c, o, progress, phase);
      } catch (keep_alive_off& k) {
        r = std::move(k.r);
        reusable = false;
      }
      if (reusable) lease.keep();
      co_return r;
    } catch (const boost::system::system_error& e) {
      attempt_failure f{0, transport_code(e.code(), phase),
                        fmt::format("{} while {}{}", e.code().message(), phase == "body" ? "reading the body" : phase,
                                    reused ? " (on a reused connection)" : ""),
                        phase != "handshake", false, e.code().value()};
      if (phase == "handshake" && cfg.ca_bundle.empty())
        f.message += "; set AWS_CA_BUNDLE to a PEM file with the server's CA";
      throw f;
    }
  }

  [[noreturn]] void fail(const op& o, const attempt_failure& f, unsigned attempt, std::size_t progress) {
    s3_error_info info;
    info.operation = o.name;
    info.endpoint = cfg.endpoint.url();
    info.bucket = o.bucket;
    info.key = o.key;
    if (o.ranged) info.range = byte_range{o.begin, o.end};
    info.http_status = f.status;
    info.s3_code = f.code;
    info.message = f.message;
    if (o.ranged && progress > 0) info.message += fmt::format(" (after {} of {} bytes)", progress, o.end - o.begin);
    if ((f.status == 403 || f.status == 401) && cfg.creds.anonymous())
      info.message += "; the request was unsigned: credentials " + cfg.creds.source;
    info.attempt = attempt;
    info.max_attempts = cfg.retry.max_attempts;
    if (f.changed || f.status == 412) throw s3_object_changed_error(std::move(info), f.ec);
    if (f.status == 404) throw s3_not_found_error(std::move(info), f.ec);
    if (f.status == 403 || f.status == 401) throw s3_access_error(std::move(info), f.ec);
    throw s3_error(std::move(info), f.ec);
  }

  /// Runs `o` with retries; range GETs resume at `progress`.
  [[nodiscard]] task<std::pair<response, unsigned>> execute(op o, std::size_t& progress) {
    const unsigned max_attempts = std::max(1u, cfg.retry.max_attempts);
    for (unsigned attempt_no = 1;; ++attempt_no) {
      std::optional<attempt_failure> failure;
      const std::size_t before = progress;
      ++counters.requests;
      try {
        response r = co_await attempt(o, progress);
        if (r.status >= 200 && r.status < 300) co_return std::pair{std::move(r), attempt_no};
        if (r.status == 416 && o.ranged) co_return std::pair{std::move(r), attempt_no};   // at/after the end
        const auto doc = detail::parse_error_document(r.body);
        if (r.status == 409 && o.name == "CreateBucket" && doc && doc->code == "BucketAlreadyOwnedByYou")
          co_return std::pair{std::move(r), attempt_no};
        attempt_failure f;
        f.status = r.status;
        if (doc) {
          f.code = doc->code;
          f.message = doc->message;
        } else if (!r.body.empty()) {
          // Not an S3 error document (an HTML page from a proxy, a cut body):
          // quote its start, so the error says what came back.
          f.message = "unexpected response body: " + detail::excerpt(r.body);
        }
        if (f.code.empty()) {
          switch (r.status) {
            case 404: f.code = o.key.empty() ? "NoSuchBucket" : "NotFound"; break;
            case 403: f.code = "AccessDenied"; break;
            case 412: f.code = "PreconditionFailed"; break;
            case 503: f.code = "ServiceUnavailable"; break;
            default: f.code = "HTTP" + std::to_string(r.status); break;
          }
        }
        if (r.status == 412) {
          f.changed = true;
          f.message += fmt::format(" (the object no longer has ETag {})", o.if_match);
        }
        if (r.status == 301 || r.status == 307) f.message += " (wrong region or endpoint for this bucket?)";
        f.retryable = is_retryable(r.status, f.code);
        failure = std::move(f);
      } catch (attempt_failure& f) {
        failure = std::move(f);
      }
      if (cancelled) throw_cancelled(o);  // the failure is the cancellation's doing: not retried
      if (!failure->retryable || attempt_no >= max_attempts) fail(o, *failure, attempt_no, progress);
      ++counters.retries;
      // A stale keep-alive connection fails before any response: retry at once.
      auto delay = cfg.retry.backoff(attempt_no, random());
      if (failure->code == "ConnectionClosed" && progress == before && attempt_no == 1) delay = {};
      if (delay.count() > 0) {
        asio::steady_timer t(ex, delay);
        co_await t.async_wait(asio::use_awaitable);
      }
    }
  }
};

}  // namespace sluice::inline v0::s3
