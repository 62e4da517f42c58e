// The S3 client (see include/sluice/s3/client.hpp): S3 over the HTTP room's
// client (http/client.hpp). What is S3's is here: addressing (virtual-hosted
// or path-style), SigV4 on every attempt, reading S3 error documents and
// S3's retryable codes, and the typed errors.
#include <sluice/s3/client.hpp>

#include <sluice/http/client.hpp>
#include <sluice/s3/retry.hpp>

#include "xml.hpp"

#include <iterator>
#include <set>

#include <fmt/format.h>

namespace sluice::inline v0::s3 {

namespace {
http::client_options http_options(const config& c) {
  http::client_options o;
  o.endpoint = c.endpoint;
  o.verify_tls = c.verify_tls;
  o.ca_bundle = c.ca_bundle;
  o.max_connections = c.max_connections;
  o.connect_timeout = c.connect_timeout;
  o.low_speed_limit = c.low_speed_limit;
  o.low_speed_window = c.low_speed_window;
  o.retry = c.retry;
  o.ca_hint = "set AWS_CA_BUNDLE to a PEM file with the server's CA";
  return o;
}
}  // namespace

struct client::impl {
  impl(asio::any_io_executor ex, config c) : cfg(std::move(c)), http(std::move(ex), http_options(cfg)) {}

  config cfg;
  http::client http;

  std::string host_for(const std::string& bucket) const {
    if (bucket.empty() || cfg.use_path_style(bucket)) return cfg.endpoint.host;
    return bucket + "." + cfg.endpoint.host;
  }
  std::string path_for(const std::string& bucket, const std::string& key) const {
    if (bucket.empty()) return "/";
    if (cfg.use_path_style(bucket)) return "/" + bucket + (key.empty() ? "" : "/" + key);
    return "/" + key;
  }

  /// One S3 operation: its HTTP request, and the hooks that make it S3's
  /// (they refer to this object: it lives in the calling coroutine's frame
  /// until the request completes).
  struct op {
    std::string bucket, key;
    std::vector<std::pair<std::string, std::string>> query;
    http::request req;
    http::request_hooks hooks;
  };

  void bind(op& o) {
    o.req.host = host_for(o.bucket);
    o.hooks.store = "S3";
    o.hooks.prepare = [this, &o](const http::request& r, const http::header_list& headers, http::wire_request& w) {
      signable_request sr;
      sr.method = r.method;
      sr.path = path_for(o.bucket, o.key);
      sr.query = o.query;
      sr.headers = headers;
      sr.payload_hash = r.body.empty() ? std::string(r.method == "PUT" ? empty_payload_sha256 : unsigned_payload) : sha256_hex(r.body);
      (void)sign(sr, cfg.creds, cfg.region, std::chrono::system_clock::now());
      w.target = sr.target();
      w.headers = std::move(sr.headers);
    };
    o.hooks.classify = [&o](const http::request& r, const http::response& a) -> std::optional<http::failure> {
      const auto doc = detail::parse_error_document(a.body);
      if (a.status == 409 && r.operation == "CreateBucket" && doc && doc->code == "BucketAlreadyOwnedByYou") return std::nullopt;
      http::failure f;
      f.status = a.status;
      if (doc) {
        f.code = doc->code;
        f.message = doc->message;
      } else if (!a.body.empty()) {
        // Not an S3 error document (an HTML page from a proxy, a cut body):
        // quote its start, so the error says what came back.
        f.message = "unexpected response body: " + detail::excerpt(a.body);
      }
      if (f.code.empty()) {
        switch (a.status) {
          case 404: f.code = o.key.empty() ? "NoSuchBucket" : "NotFound"; break;
          case 403: f.code = "AccessDenied"; break;
          case 412: f.code = "PreconditionFailed"; break;
          case 503: f.code = "ServiceUnavailable"; break;
          default: f.code = "HTTP" + std::to_string(a.status); break;
        }
      }
      if (a.status == 412) {
        f.changed = true;
        f.message += fmt::format(" (the object no longer has ETag {})", r.if_match);
      }
      if (a.status == 301 || a.status == 307) f.message += " (wrong region or endpoint for this bucket?)";
      f.retryable = is_retryable(a.status, f.code);
      return f;
    };
    o.hooks.fail = [this, &o](const http::request& r, const http::failure& f, unsigned attempt, std::size_t progress) {
      s3_error_info info;
      info.operation = r.operation;
      info.endpoint = cfg.endpoint.url();
      info.bucket = o.bucket;
      info.key = o.key;
      if (r.ranged) info.range = byte_range{r.begin, r.end};
      info.http_status = f.status;
      info.s3_code = f.code;
      info.message = f.message;
      if (r.ranged && progress > 0) info.message += fmt::format(" (after {} of {} bytes)", progress, r.end - r.begin);
      if ((f.status == 403 || f.status == 401) && cfg.creds.anonymous())
        info.message += "; the request was unsigned: credentials " + cfg.creds.source;
      info.attempt = attempt;
      info.max_attempts = cfg.retry.max_attempts;
      if (f.changed || f.status == 412) throw s3_object_changed_error(std::move(info), f.ec);
      if (f.status == 404) throw s3_not_found_error(std::move(info), f.ec);
      if (f.status == 403 || f.status == 401) throw s3_access_error(std::move(info), f.ec);
      throw s3_error(std::move(info), f.ec);
    };
    o.hooks.describe = [&o](const http::request&) { return fmt::format("bucket {}, key {}", o.bucket, o.key); };
  }

  /// Runs `o` (bound here) to its end.
  task<http::result> run(op& o) {
    bind(o);
    co_return co_await http.execute(o.req, o.hooks);
  }
};

client::client(asio::any_io_executor ex, config cfg) : impl_(std::make_unique<impl>(std::move(ex), std::move(cfg))) {}
client::~client() = default;

const s3::config& client::cfg() const noexcept { return impl_->cfg; }
asio::any_io_executor client::get_executor() const noexcept { return impl_->http.get_executor(); }
const io_counters& client::counters() const noexcept { return impl_->http.counters(); }
std::size_t client::idle_connections() const { return impl_->http.idle_connections(); }
std::size_t client::busy_connections() const { return impl_->http.busy_connections(); }
void client::cancel() { impl_->http.cancel(); }
bool client::cancelled() const noexcept { return impl_->http.cancelled(); }

task<object_info> client::head(std::string bucket, std::string key) {
  impl::op o;
  o.bucket = std::move(bucket);
  o.key = std::move(key);
  o.req.operation = "HEAD";
  o.req.method = "HEAD";
  auto r = co_await impl_->run(o);
  ++impl_->http.counters().files_opened;
  co_return object_info{r.answer.object_size, r.answer.etag};
}

task<range_result> client::get_range(std::string bucket, std::string key, std::uint64_t offset,
                                     std::span<std::byte> dst, std::string if_match) {
  range_result out;
  if (dst.empty()) co_return out;
  impl::op o;
  o.bucket = std::move(bucket);
  o.key = std::move(key);
  o.req.operation = "GET";
  o.req.ranged = true;
  o.req.begin = offset;
  o.req.end = offset + dst.size();
  o.req.dst = dst.data();
  o.req.if_match = std::move(if_match);
  auto r = co_await impl_->run(o);
  out.bytes = r.bytes;
  out.object_size = r.answer.object_size;
  out.etag = r.answer.etag;
  out.attempts = r.attempts;
  co_return out;
}

task<list_result> client::list(std::string bucket, std::string prefix, std::string delimiter, unsigned max_keys) {
  list_result out;
  std::string token;
  // A server that keeps saying "truncated" (or hands back a token it gave
  // before) ends the listing with an error, not a loop.
  std::set<std::string> tokens_seen;
  for (;;) {
    impl::op o;
    o.bucket = bucket;
    o.req.operation = "ListObjectsV2";
    o.query = {{"list-type", "2"}, {"max-keys", std::to_string(max_keys)}};
    if (!prefix.empty()) o.query.emplace_back("prefix", prefix);
    if (!delimiter.empty()) o.query.emplace_back("delimiter", delimiter);
    if (!token.empty()) o.query.emplace_back("continuation-token", token);
    auto r = co_await impl_->run(o);
    ++out.pages;
    auto fail = [&](std::string code, std::string message) {
      throw s3_error(s3_error_info{"ListObjectsV2", impl_->cfg.endpoint.url(), bucket, prefix, std::nullopt, r.answer.status,
                                   std::move(code), std::move(message), r.attempts, impl_->cfg.retry.max_attempts});
    };
    detail::list_page page;
    try {
      page = detail::parse_list_page(r.answer.body);
    } catch (const detail::malformed_xml& e) {
      fail("MalformedResponse", fmt::format("page {} of the listing: {}", out.pages, e.what()));
    }
    if (auto bad = detail::check_list_page(page, prefix, max_keys))
      fail("MalformedResponse", fmt::format("page {} of the listing: {}", out.pages, *bad));
    std::move(page.objects.begin(), page.objects.end(), std::back_inserter(out.objects));
    std::move(page.common_prefixes.begin(), page.common_prefixes.end(), std::back_inserter(out.common_prefixes));
    token = std::move(page.next_token);
    if (!page.truncated) break;
    if (token.empty()) fail("MissingContinuationToken", "IsTruncated without NextContinuationToken");
    if (!tokens_seen.insert(token).second)
      fail("RepeatedContinuationToken", fmt::format("page {} hands back a continuation token of an earlier page", out.pages));
    if (out.pages >= impl_->cfg.max_list_pages)
      fail("ListingTooLong", fmt::format("still truncated after {} pages ({} keys)", out.pages, out.objects.size()));
  }
  co_return out;
}

task<std::string> client::put(std::string bucket, std::string key, std::span<const std::byte> body) {
  impl::op o;
  o.bucket = std::move(bucket);
  o.key = std::move(key);
  o.req.operation = "PUT";
  o.req.method = "PUT";
  o.req.body.assign(reinterpret_cast<const char*>(body.data()), body.size());
  auto r = co_await impl_->run(o);
  co_return r.answer.etag;
}

task<void> client::create_bucket(std::string bucket) {
  impl::op o;
  o.bucket = std::move(bucket);
  o.req.operation = "CreateBucket";
  o.req.method = "PUT";
  (void)co_await impl_->run(o);
}

}  // namespace sluice::inline v0::s3
