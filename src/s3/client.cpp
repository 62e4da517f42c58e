// The S3 client (see include/sluice/s3/client.hpp): its public members, and
// attempts over plain TCP. TLS attempts are client_tls.cpp's.
#include "client_attempt.hpp"

#include <set>

namespace sluice::inline v0::s3 {

template task<response> client::impl::attempt_on<plain_stream>(plain_stream&, connection&, op&, std::size_t&,
                                                                std::string&);

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
  // A server that keeps saying "truncated" (or hands back a token it gave
  // before) ends the listing with an error, not a loop.
  std::set<std::string> tokens_seen;
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
