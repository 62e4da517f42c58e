// client::impl's attempt over one stream type (see client_impl.hpp): the
// template's definition, and the two instantiations, each made in its own
// unit (client.cpp: plain TCP; client_tls.cpp: TLS).
#pragma once

#include "client_impl.hpp"

namespace sluice::inline v0::s3 {

using plain_stream = beast::tcp_stream;
using tls_stream = ssl::stream<beast::tcp_stream>;

/// Reads raw body bytes into [p, p + n) with low-speed detection; `progress`
/// counts what has arrived (kept across a failure for resumption).
template <class Stream>
task<void> client::impl::read_body_into(Stream& s, connection& c, std::byte* p, std::uint64_t n,
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
task<response> client::impl::attempt_on(Stream& s, connection& c, op& o, std::size_t& progress,
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
    // What the answer allows (range_answer.hpp: strict, no wraparound, never
    // more than the destination holds), then read straight into dst.
    const std::uint64_t want_first = o.begin + progress;
    const auto cr = h.find(http::field::content_range);
    const auto checked =
        sluice::http::detail::check_range_answer(want_first, o.end, r.status,
                           cr == h.end() ? std::nullopt : std::optional<std::string_view>(sv(cr->value())), r.content_length);
    if (const auto* no = std::get_if<sluice::http::detail::range_refusal>(&checked)) throw attempt_failure{r.status, no->code, no->message, false};
    const auto& body = std::get<sluice::http::detail::range_body>(checked);
    r.object_size = body.object_size;
    if (!o.if_match.empty() && r.etag != o.if_match)
      throw attempt_failure{r.status, "ObjectChanged",
                            fmt::format("ETag is now {}, was {} when first seen", r.etag, o.if_match), false, true};
    o.end = std::min(o.end, r.object_size);
    if (o.if_match.empty()) o.if_match = r.etag;   // pin the version for resumed requests
    phase = "body";
    co_await read_body_into(s, c, o.dst + (body.first - o.begin), body.count, progress);
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
      if (auto cr = sluice::http::detail::parse_content_range(sv(sp.get()[http::field::content_range])); cr && cr->total)
        r.object_size = *cr->total;
    }
  }
  c.lowest().expires_never();
  if (!keep_alive) throw keep_alive_off{std::move(r)};
  co_return r;
}

extern template task<response> client::impl::attempt_on<plain_stream>(plain_stream&, connection&, op&, std::size_t&,
                                                                       std::string&);
extern template task<response> client::impl::attempt_on<tls_stream>(tls_stream&, connection&, op&, std::size_t&,
                                                                     std::string&);

}  // namespace sluice::inline v0::s3
