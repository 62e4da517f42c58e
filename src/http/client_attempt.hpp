// client::impl's attempt over one stream type (see client_impl.hpp): the
// template's definition, and the two instantiations, each made in its own
// unit (client.cpp: plain TCP; client_tls.cpp: TLS).
#pragma once

#include "client_impl.hpp"

namespace sluice::inline v0::http {

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
  if (c.buffer.size() != 0) throw failure{0, "ProtocolError", "more body bytes than Content-Length", true};
  std::uint64_t done = buffered;
  auto window_start = clock_type::now();
  std::uint64_t window_bytes = 0;
  const auto window = opt.low_speed_window;
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
      if (static_cast<double>(window_bytes) < static_cast<double>(opt.low_speed_limit) * secs)
        throw failure{0, "LowSpeed",
                      fmt::format("{} bytes in {:.1f} s, below the floor of {} bytes/s", window_bytes, secs, opt.low_speed_limit),
                      true};
      window_start = now;
      window_bytes = 0;
    }
  }
  c.lowest().expires_never();
}

/// One attempt of `r` on connection `c` over stream `s`.
template <class Stream>
task<response> client::impl::attempt_on(Stream& s, connection& c, request& r, const request_hooks& hooks,
                                        std::size_t& progress, std::string& phase) {
  header_list headers;
  headers.emplace_back("host", opt.endpoint.host_header(c.host));
  if (r.ranged) headers.emplace_back("range", fmt::format("bytes={}-{}", r.begin + progress, r.end - 1));
  if (!r.if_match.empty()) headers.emplace_back("if-match", r.if_match);
  wire_request w;
  hooks.prepare(r, headers, w);

  const auto method = verb_of(r.method);
  bhttp::request<bhttp::string_body> req{method, w.target, 11};
  for (const auto& [k, v] : w.headers) req.set(k, v);
  req.set(bhttp::field::user_agent, "sluice/0.1");
  req.keep_alive(true);
  if (method == bhttp::verb::put || !r.body.empty()) {
    req.body() = r.body;
    req.prepare_payload();
  }

  phase = "send";
  c.lowest().expires_after(opt.low_speed_window);
  co_await bhttp::async_write(s, req, asio::use_awaitable);

  phase = "header";
  bhttp::response_parser<bhttp::empty_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  if (method == bhttp::verb::head) parser.skip(true);
  c.lowest().expires_after(opt.low_speed_window);
  co_await bhttp::async_read_header(s, c.buffer, parser, asio::use_awaitable);

  response a;
  const auto& h = parser.get();
  a.status = h.result_int();
  a.etag = std::string(h[bhttp::field::etag]);
  if (auto cl = parser.content_length()) a.content_length = *cl;
  const bool keep_alive = parser.keep_alive();
  const bool success = a.status >= 200 && a.status < 300;

  if (success && r.ranged) {
    // What the answer allows (range_answer.hpp: strict, no wraparound, never
    // more than the destination holds), then read straight into dst.
    const std::uint64_t want_first = r.begin + progress;
    const auto cr = h.find(bhttp::field::content_range);
    const auto checked = detail::check_range_answer(
        want_first, r.end, a.status, cr == h.end() ? std::nullopt : std::optional<std::string_view>(sv(cr->value())), a.content_length);
    if (const auto* no = std::get_if<detail::range_refusal>(&checked)) throw failure{a.status, no->code, no->message, false};
    const auto& body = std::get<detail::range_body>(checked);
    a.object_size = body.object_size;
    if (!r.if_match.empty() && a.etag != r.if_match)
      throw failure{a.status, "ObjectChanged", fmt::format("ETag is now {}, was {} when first seen", a.etag, r.if_match), false,
                    true};
    r.end = std::min(r.end, a.object_size);
    if (r.if_match.empty()) r.if_match = a.etag;   // pin the version for resumed requests
    phase = "body";
    co_await read_body_into(s, c, r.dst + (body.first - r.begin), body.count, progress);
  } else if (method == bhttp::verb::head) {
    a.object_size = a.content_length.value_or(0);
  } else {
    // Small bodies: listings, PUT results, error documents, 416.
    phase = "body";
    bhttp::response_parser<bhttp::string_body> sp{std::move(parser)};
    sp.body_limit(max_small_body);
    c.lowest().expires_after(opt.low_speed_window);
    co_await bhttp::async_read(s, c.buffer, sp, asio::use_awaitable);
    a.body = std::move(sp.get().body());
    if (a.status == 416) {
      if (auto cr = detail::parse_content_range(sv(sp.get()[bhttp::field::content_range])); cr && cr->total)
        a.object_size = *cr->total;
    }
  }
  c.lowest().expires_never();
  if (!keep_alive) throw keep_alive_off{std::move(a)};
  co_return a;
}

extern template task<response> client::impl::attempt_on<plain_stream>(plain_stream&, connection&, request&,
                                                                       const request_hooks&, std::size_t&, std::string&);
extern template task<response> client::impl::attempt_on<tls_stream>(tls_stream&, connection&, request&,
                                                                     const request_hooks&, std::size_t&, std::string&);

}  // namespace sluice::inline v0::http
