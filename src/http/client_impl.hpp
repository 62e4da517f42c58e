// The HTTP client's implementation (client.cpp, client_tls.cpp): with
// client_attempt.hpp, the only headers of sluice that include Boost.Beast,
// private to src/http. An attempt over a stream (client::impl::attempt_on) is
// defined in client_attempt.hpp and instantiated once per stream type, each
// in its own unit, so that no unit of the ASan build compiles both Beast
// paths (plain TCP and TLS).
#pragma once

#include <utility>   // before Asio (Boost 1.74)

#include <sluice/error.hpp>
#include <sluice/http/client.hpp>
#include <sluice/http/connection_pool.hpp>

#include "range_answer.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
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

namespace sluice::inline v0::http {

namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using clock_type = std::chrono::steady_clock;

namespace client_detail {

inline constexpr std::size_t header_buffer_size = 16 * 1024;        // headers + first body bytes
inline constexpr std::uint64_t max_small_body = 64ull * 1024 * 1024;  // listings, error documents

/// One keep-alive connection to one host.
struct connection {
  std::string host;   ///< the host name it is connected to
  std::optional<beast::tcp_stream> plain;
  std::optional<ssl::stream<beast::tcp_stream>> tls;
  beast::flat_buffer buffer;
  beast::tcp_stream& lowest() { return tls ? beast::get_lowest_layer(*tls) : *plain; }
};

inline std::string_view sv(beast::string_view s) { return {s.data(), s.size()}; }

inline std::string transport_code(const boost::system::error_code& ec, std::string_view phase) {
  if (ec == beast::error::timeout) return phase == "connect" ? "ConnectTimeout" : "Timeout";
  if (ec == asio::error::connection_reset) return "ConnectionReset";
  if (ec == asio::error::connection_refused) return "ConnectionRefused";
  if (ec == asio::error::broken_pipe) return "BrokenPipe";
  if (ec.category() == asio::error::get_ssl_category() || ec == ssl::error::stream_truncated)
    return phase == "handshake" ? "TLSHandshakeFailed" : "TLSError";
  if (ec == asio::error::eof || ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message)
    return phase == "body" ? "TruncatedBody" : "ConnectionClosed";
  if (ec.category() == asio::error::get_netdb_category() || ec.category() == asio::error::get_addrinfo_category())
    return "NameResolutionFailed";
  return "TransportError";
}

inline bhttp::verb verb_of(std::string_view method) {
  if (method == "HEAD") return bhttp::verb::head;
  if (method == "PUT") return bhttp::verb::put;
  return bhttp::verb::get;
}

}  // namespace client_detail
using namespace client_detail;

struct client::impl {
  impl(asio::any_io_executor e, client_options o)
      : ex(std::move(e)), opt(std::move(o)), pool(opt.max_connections), tls_ctx(ssl::context::tls_client) {
    if (opt.endpoint.tls()) {
      if (opt.verify_tls) {
        tls_ctx.set_verify_mode(ssl::verify_peer);
        if (!opt.ca_bundle.empty()) {
          boost::system::error_code ec;
          tls_ctx.load_verify_file(opt.ca_bundle, ec);
          if (ec) throw config_error(fmt::format("cannot load CA bundle '{}': {}", opt.ca_bundle, ec.message()));
        } else {
          tls_ctx.set_default_verify_paths();
        }
      } else {
        tls_ctx.set_verify_mode(ssl::verify_none);
      }
    }
  }

  asio::any_io_executor ex;
  client_options opt;
  connection_pool<connection> pool;
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

  [[nodiscard]] task<void> connect(connection& c, std::string host, std::string& phase) {
    c.host = host;
    c.buffer.clear();
    c.buffer.reserve(header_buffer_size);
    phase = "resolve";
    tcp::resolver resolver(ex);
    auto results = co_await resolver.async_resolve(host, std::to_string(opt.endpoint.port), asio::use_awaitable);
    phase = "connect";
    if (opt.endpoint.tls()) {
      c.tls.emplace(ex, tls_ctx);
      if (opt.verify_tls) c.tls->set_verify_callback(ssl::host_name_verification(host));
      boost::system::error_code not_an_ip;
      (void)asio::ip::make_address(host, not_an_ip);
      if (not_an_ip) {
        // A host name (not an IP literal): send SNI.
        if (!::SSL_set_tlsext_host_name(c.tls->native_handle(), host.c_str()))
          throw boost::system::system_error(static_cast<int>(::ERR_get_error()), asio::error::get_ssl_category());
      }
      c.lowest().expires_after(opt.connect_timeout);
      co_await c.lowest().async_connect(results, asio::use_awaitable);
      c.lowest().socket().set_option(tcp::no_delay(true));
      phase = "handshake";
      c.lowest().expires_after(opt.connect_timeout);
      co_await c.tls->async_handshake(ssl::stream_base::client, asio::use_awaitable);
    } else {
      c.plain.emplace(ex);
      c.lowest().expires_after(opt.connect_timeout);
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

  /// One attempt of `r` on connection `c` over stream `s` (client_attempt.hpp).
  template <class Stream>
  [[nodiscard]] task<response> attempt_on(Stream& s, connection& c, request& r, const request_hooks& hooks,
                                          std::size_t& progress, std::string& phase);

  /// A response that completed but closes the connection (not an error).
  struct keep_alive_off {
    response r;
  };

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

  [[noreturn]] void throw_cancelled(const request& r, const request_hooks& hooks) const {
    throw cancelled_error(fmt::format("{} {} cancelled (endpoint {}, {}{})", hooks.store, r.operation, opt.endpoint.url(),
                                      hooks.describe ? hooks.describe(r) : r.host,
                                      r.ranged ? fmt::format(", bytes={}-{}", r.begin, r.end - 1) : ""));
  }

  /// One attempt on a pooled connection. Returns the response or throws failure.
  [[nodiscard]] task<response> attempt(request& r, const request_hooks& hooks, std::size_t& progress) {
    auto lease = co_await pool.acquire();
    if (cancelled) throw_cancelled(r, hooks);
    std::string phase = "connect";
    const bool reused = lease.conn && lease.conn->host == r.host;
    std::optional<in_flight> registered;
    try {
      if (!reused) {
        lease.conn = std::make_unique<connection>();
        co_await connect(*lease.conn, r.host, phase);
      }
      connection& c = *lease.conn;
      registered.emplace(*this, c.lowest().socket().native_handle());
      if (cancelled) throw_cancelled(r, hooks);  // a cancel() before the registration saw no socket
      response a;
      bool reusable = true;
      try {
        if (c.tls)
          a = co_await attempt_on(*c.tls, c, r, hooks, progress, phase);
        else
          a = co_await attempt_on(*c.plain, c, r, hooks, progress, phase);
      } catch (keep_alive_off& k) {
        a = std::move(k.r);
        reusable = false;
      }
      if (reusable) lease.keep();
      co_return a;
    } catch (const boost::system::system_error& e) {
      failure f{0, transport_code(e.code(), phase),
                fmt::format("{} while {}{}", e.code().message(), phase == "body" ? "reading the body" : phase,
                            reused ? " (on a reused connection)" : ""),
                phase != "handshake", false, e.code().value()};
      if (phase == "handshake" && opt.ca_bundle.empty() && !opt.ca_hint.empty()) f.message += "; " + opt.ca_hint;
      throw f;
    }
  }

  /// Runs `r` with retries; range GETs resume at `progress`.
  [[nodiscard]] task<result> execute(request r, const request_hooks& hooks) {
    const unsigned max_attempts = std::max(1u, opt.retry.max_attempts);
    std::size_t progress = 0;
    for (unsigned attempt_no = 1;; ++attempt_no) {
      std::optional<failure> failed;
      const std::size_t before = progress;
      ++counters.requests;
      try {
        response a = co_await attempt(r, hooks, progress);
        const bool done = (a.status >= 200 && a.status < 300) || (a.status == 416 && r.ranged);  // 416: at/after the end
        if (!done) failed = hooks.classify(r, a);
        if (!failed) co_return result{std::move(a), attempt_no, progress};
      } catch (failure& f) {
        failed = std::move(f);
      }
      if (cancelled) throw_cancelled(r, hooks);  // the failure is the cancellation's doing: not retried
      if (!failed->retryable || attempt_no >= max_attempts) {
        hooks.fail(r, *failed, attempt_no, progress);
        throw std::logic_error("request_hooks::fail returned");  // it must throw
      }
      ++counters.retries;
      // A stale keep-alive connection fails before any response: retry at once.
      auto delay = opt.retry.backoff(attempt_no, random());
      if (failed->code == "ConnectionClosed" && progress == before && attempt_no == 1) delay = {};
      if (delay.count() > 0) {
        asio::steady_timer t(ex, delay);
        co_await t.async_wait(asio::use_awaitable);
      }
    }
  }
};

}  // namespace sluice::inline v0::http
