// The S3 client (see include/sluice/s3/client.hpp). The only translation
// unit of sluice that includes Boost.Beast.
#include <utility>   // before Asio (Boost 1.74)

#include <sluice/s3/client.hpp>
#include <sluice/s3/connection_pool.hpp>

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

namespace {

constexpr std::size_t header_buffer_size = 16 * 1024;        // headers + first body bytes
constexpr std::uint64_t max_small_body = 64ull * 1024 * 1024;  // listings, error documents

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

std::string_view sv(beast::string_view s) { return {s.data(), s.size()}; }

std::uint64_t to_u64(std::string_view s) {
  std::uint64_t v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  return v;
}

/// "bytes B-E/T" or "bytes */T".
struct content_range {
  std::optional<std::uint64_t> first, last;
  std::optional<std::uint64_t> total;
};
std::optional<content_range> parse_content_range(std::string_view v) {
  if (!v.starts_with("bytes ")) return std::nullopt;
  v.remove_prefix(6);
  auto slash = v.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  content_range cr;
  auto range = v.substr(0, slash), total = v.substr(slash + 1);
  if (total != "*") cr.total = to_u64(total);
  if (range != "*") {
    auto dash = range.find('-');
    if (dash == std::string_view::npos) return std::nullopt;
    cr.first = to_u64(range.substr(0, dash));
    cr.last = to_u64(range.substr(dash + 1));
  }
  return cr;
}

std::string transport_code(const boost::system::error_code& ec, std::string_view phase) {
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

}  // namespace

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
  /// counts what has arrived (kept across a failure for resumption).
  template <class Stream>
  [[nodiscard]] task<void> read_body_into(Stream& s, connection& c, std::byte* p, std::uint64_t n,
                                          std::size_t& progress) {
    // First the body bytes that arrived together with the headers.
    const std::size_t buffered = std::min<std::uint64_t>(c.buffer.size(), n);
    if (buffered) {
      std::memcpy(p, c.buffer.data().data(), buffered);
      c.buffer.consume(buffered);
      progress += buffered;
      counters.bytes_read += buffered;
    }
    if (c.buffer.size() != 0) throw attempt_failure{0, "ProtocolError", "more body bytes than Content-Length", true};
    std::uint64_t done = buffered;
    auto window_start = clock_type::now();
    std::uint64_t window_bytes = 0;
    const auto window = cfg.low_speed_window;
    while (done < n) {
      c.lowest().expires_after(window);
      const std::size_t chunk = static_cast<std::size_t>(std::min<std::uint64_t>(n - done, 64ull << 20));
      std::size_t got = co_await s.async_read_some(asio::buffer(p + done, chunk), asio::use_awaitable);
      done += got;
      progress += got;
      counters.bytes_read += got;
      window_bytes += got;
      const auto now = clock_type::now();
      if (now - window_start >= window) {
        const double secs = std::chrono::duration<double>(now - window_start).count();
        if (static_cast<double>(window_bytes) < static_cast<double>(cfg.low_speed_limit) * secs)
          throw attempt_failure{0, "LowSpeed",
                                fmt::format("{} bytes in {:.1f} s, below the floor of {} bytes/s", window_bytes, secs,
                                            cfg.low_speed_limit),
                                true};
        window_start = now;
        window_bytes = 0;
      }
    }
    c.lowest().expires_never();
  }

  /// One attempt of `o` on connection `c` over stream `s`.
  template <class Stream>
  [[nodiscard]] task<response> attempt_on(Stream& s, connection& c, op& o, std::size_t& progress,
                                          std::string& phase) {
    signable_request sr;
    sr.method = std::string(http::to_string(o.method));
    sr.path = path_for(o.bucket, o.key);
    sr.query = o.query;
    sr.headers.emplace_back("host", cfg.endpoint.host_header(c.host));
    if (o.ranged) sr.headers.emplace_back("range", fmt::format("bytes={}-{}", o.begin + progress, o.end - 1));
    if (!o.if_match.empty()) sr.headers.emplace_back("if-match", o.if_match);
    sr.payload_hash = o.body.empty() ? std::string(o.method == http::verb::put ? empty_payload_sha256 : unsigned_payload)
                                     : sha256_hex(o.body);
    (void)sign(sr, cfg.creds, cfg.region, std::chrono::system_clock::now());

    http::request<http::string_body> req{o.method, sr.target(), 11};
    for (const auto& [k, v] : sr.headers) req.set(k, v);
    req.set(http::field::user_agent, "sluice/0.1");
    req.keep_alive(true);
    if (o.method == http::verb::put || !o.body.empty()) {
      req.body() = o.body;
      req.prepare_payload();
    }

    phase = "send";
    c.lowest().expires_after(cfg.low_speed_window);
    co_await http::async_write(s, req, asio::use_awaitable);

    phase = "header";
    http::response_parser<http::empty_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    if (o.method == http::verb::head) parser.skip(true);
    c.lowest().expires_after(cfg.low_speed_window);
    co_await http::async_read_header(s, c.buffer, parser, asio::use_awaitable);

    response r;
    const auto& h = parser.get();
    r.status = h.result_int();
    r.etag = std::string(h[http::field::etag]);
    if (auto cl = parser.content_length()) r.content_length = *cl;
    const bool keep_alive = parser.keep_alive();
    const bool success = r.status >= 200 && r.status < 300;

    if (success && o.ranged) {
      // Verify Content-Range and the length, then read straight into dst.
      const std::uint64_t want_first = o.begin + progress;
      std::uint64_t first = 0, last = 0;
      if (r.status == 206) {
        auto cr = parse_content_range(sv(h[http::field::content_range]));
        if (!cr || !cr->first || !cr->last || !cr->total)
          throw attempt_failure{r.status, "BadContentRange",
                                fmt::format("206 with Content-Range '{}'", std::string(h[http::field::content_range])),
                                false};
        first = *cr->first;
        last = *cr->last;
        r.object_size = *cr->total;
      } else if (r.status == 200 && want_first == 0 && r.content_length) {
        // The whole object (a server that ignores Range for a range covering it).
        first = 0;
        last = *r.content_length - 1;
        r.object_size = *r.content_length;
        if (*r.content_length > o.end)
          throw attempt_failure{r.status, "RangeIgnored", "the server ignored the Range header", false};
      } else {
        throw attempt_failure{r.status, "RangeIgnored",
                              fmt::format("expected 206 Partial Content, got {}", r.status), false};
      }
      const std::uint64_t want_last = std::min(o.end, r.object_size) - 1;
      if (first != want_first || last != want_last)
        throw attempt_failure{r.status, "BadContentRange",
                              fmt::format("asked for bytes {}-{}, got {}-{}", want_first, want_last, first, last), false};
      if (!r.content_length || *r.content_length != last - first + 1)
        throw attempt_failure{r.status, "BadContentLength",
                              fmt::format("Content-Length {} for bytes {}-{}",
                                          r.content_length ? std::to_string(*r.content_length) : "missing", first, last),
                              false};
      if (!o.if_match.empty() && r.etag != o.if_match)
        throw attempt_failure{r.status, "ObjectChanged",
                              fmt::format("ETag is now {}, was {} when first seen", r.etag, o.if_match), false, true};
      o.end = std::min(o.end, r.object_size);
      if (o.if_match.empty()) o.if_match = r.etag;   // pin the version for resumed requests
      phase = "body";
      co_await read_body_into(s, c, o.dst + (first - o.begin), last - first + 1, progress);
    } else if (o.method == http::verb::head) {
      r.object_size = r.content_length.value_or(0);
    } else {
      // Small bodies: listings, PUT/CreateBucket results, error documents, 416.
      phase = "body";
      http::response_parser<http::string_body> sp{std::move(parser)};
      sp.body_limit(max_small_body);
      c.lowest().expires_after(cfg.low_speed_window);
      co_await http::async_read(s, c.buffer, sp, asio::use_awaitable);
      r.body = std::move(sp.get().body());
      if (r.status == 416) {
        if (auto cr = parse_content_range(sv(sp.get()[http::field::content_range])); cr && cr->total)
          r.object_size = *cr->total;
      }
    }
    c.lowest().expires_never();
    if (!keep_alive) throw keep_alive_off{std::move(r)};
    co_return r;
  }

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

client::client(asio::any_io_executor ex, config cfg) : impl_(std::make_unique<impl>(std::move(ex), std::move(cfg))) {}
client::~client() = default;

const s3::config& client::cfg() const noexcept { return impl_->cfg; }
asio::any_io_executor client::get_executor() const noexcept { return impl_->ex; }
const io_counters& client::counters() const noexcept { return impl_->counters; }
std::size_t client::idle_connections() const { return impl_->pool.idle(); }
std::size_t client::busy_connections() const { return impl_->pool.in_use(); }
void client::cancel() { impl_->cancel(); }
bool client::cancelled() const noexcept { return impl_->cancelled; }

task<object_info> client::head(std::string bucket, std::string key) {
  op o;
  o.name = "HEAD";
  o.method = http::verb::head;
  o.bucket = std::move(bucket);
  o.key = std::move(key);
  std::size_t progress = 0;
  auto [r, attempts] = co_await impl_->execute(std::move(o), progress);
  ++impl_->counters.files_opened;
  co_return object_info{r.object_size, r.etag};
}

task<range_result> client::get_range(std::string bucket, std::string key, std::uint64_t offset,
                                     std::span<std::byte> dst, std::string if_match) {
  range_result out;
  if (dst.empty()) co_return out;
  op o;
  o.name = "GET";
  o.bucket = std::move(bucket);
  o.key = std::move(key);
  o.ranged = true;
  o.begin = offset;
  o.end = offset + dst.size();
  o.dst = dst.data();
  o.if_match = std::move(if_match);
  std::size_t progress = 0;
  auto [r, attempts] = co_await impl_->execute(std::move(o), progress);
  out.bytes = progress;
  out.object_size = r.object_size;
  out.etag = r.etag;
  out.attempts = attempts;
  co_return out;
}

task<list_result> client::list(std::string bucket, std::string prefix, std::string delimiter, unsigned max_keys) {
  list_result out;
  std::string token;
  for (;;) {
    op o;
    o.name = "ListObjectsV2";
    o.bucket = bucket;
    o.query = {{"list-type", "2"}, {"max-keys", std::to_string(max_keys)}};
    if (!prefix.empty()) o.query.emplace_back("prefix", prefix);
    if (!delimiter.empty()) o.query.emplace_back("delimiter", delimiter);
    if (!token.empty()) o.query.emplace_back("continuation-token", token);
    std::size_t progress = 0;
    auto [r, attempts] = co_await impl_->execute(std::move(o), progress);
    ++out.pages;
    auto fail = [&](std::string code, std::string message) {
      throw s3_error(s3_error_info{"ListObjectsV2", impl_->cfg.endpoint.url(), bucket, prefix, std::nullopt, r.status,
                                   std::move(code), std::move(message), attempts, impl_->cfg.retry.max_attempts});
    };
    detail::list_page page;
    try {
      page = detail::parse_list_page(r.body);
    } catch (const detail::malformed_xml& e) {
      fail("MalformedResponse", fmt::format("page {} of the listing: {}", out.pages, e.what()));
    }
    std::move(page.objects.begin(), page.objects.end(), std::back_inserter(out.objects));
    std::move(page.common_prefixes.begin(), page.common_prefixes.end(), std::back_inserter(out.common_prefixes));
    token = std::move(page.next_token);
    if (!page.truncated) break;
    if (token.empty()) fail("MissingContinuationToken", "IsTruncated without NextContinuationToken");
  }
  co_return out;
}

task<std::string> client::put(std::string bucket, std::string key, std::span<const std::byte> body) {
  op o;
  o.name = "PUT";
  o.method = http::verb::put;
  o.bucket = std::move(bucket);
  o.key = std::move(key);
  o.body.assign(reinterpret_cast<const char*>(body.data()), body.size());
  std::size_t progress = 0;
  auto [r, attempts] = co_await impl_->execute(std::move(o), progress);
  co_return r.etag;
}

task<void> client::create_bucket(std::string bucket) {
  op o;
  o.name = "CreateBucket";
  o.method = http::verb::put;
  o.bucket = std::move(bucket);
  std::size_t progress = 0;
  (void)co_await impl_->execute(std::move(o), progress);
}

}  // namespace sluice::inline v0::s3
