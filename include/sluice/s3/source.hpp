#pragma once
/// \file
/// `s3_source`: the data path from S3 (models `sluice::source`), and
/// `s3_catalog`: metadata access to an `s3://bucket/prefix/` (a `catalog`).

#include <utility>   // before Asio (Boost 1.74)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <fmt/format.h>

#include <sluice/cache/read_through.hpp>
#include <sluice/core/run.hpp>
#include <sluice/core/task.hpp>
#include <sluice/location.hpp>
#include <sluice/source/concepts.hpp>
#include <sluice/s3/client.hpp>
#include <sluice/s3/config.hpp>
#include <sluice/s3/error.hpp>

namespace sluice::inline v0 {

/// Positional reads from S3 objects (a checkpoint's shards), addressed by file
/// index. Each object is pinned to one version: its ETag comes from a HEAD
/// (at `open()`, or lazily at its first read) or from `pin()` (e.g. what the
/// catalog saw when it read the headers), and every range GET carries
/// If-Match and checks the ETag, so an object replaced mid-load fails with
/// s3_object_changed_error instead of mixing versions.
///
/// `read_at` issues one range GET (retried and resumed by the client); the
/// pipeline's coalesce stage sizes the requests (8-16 MiB parts). Concurrency
/// is bounded by the client's connection pool (config::max_connections).
/// With a node-local cache (use_cache), reads go through it: cached blocks
/// come from local disk, verified; the others are fetched whole, once per
/// node, and written as they pass (cache/read_through.hpp).
/// Errors: the s3_error family (io_error), naming the object and byte range.
class s3_source {
 public:
  /// Reads through `client` (shared: several sources may share one pool).
  /// `uris` are "s3://bucket/key", one per file, in the checkpoint's shard order.
  s3_source(std::shared_ptr<s3::client> client, std::vector<std::string> uris)
      : client_(std::move(client)), files_(uris.size()) {
    for (std::size_t i = 0; i < uris.size(); ++i) {
      auto u = s3::object_uri::parse(uris[i]);
      files_[i].bucket = std::move(u.bucket);
      files_[i].key = std::move(u.key);
      files_[i].uri = std::move(uris[i]);
    }
  }
  /// Creates its own client on `ex` with `cfg`.
  s3_source(asio::any_io_executor ex, s3::config cfg, std::vector<std::string> uris)
      : s3_source(std::make_shared<s3::client>(std::move(ex), std::move(cfg)), std::move(uris)) {}

  /// HEADs every file not yet pinned (size + ETag). Optional: reads do it lazily.
  [[nodiscard]] task<void> open() {
    for (std::uint32_t i = 0; i < files_.size(); ++i) (void)co_await info(i);
  }

  /// Pins file `file` to a version seen elsewhere (size and ETag).
  void pin(std::uint32_t file, s3::object_info info) {
    std::lock_guard lock(mutex_);
    files_.at(file).info = std::move(info);
  }

  /// Cancels every read in flight and to come (cancelled_error): see
  /// s3::client::cancel. Thread-safe; the blocking loads call it from their
  /// stop token's callback.
  void cancel() { client_->cancel(); }

  /// Reads through the node-local cache `c` from now on, its block files
  /// read with an io_uring on `ioc` (the context this source's reads run on).
  void use_cache(std::shared_ptr<cache::block_cache> c, asio::io_context& ioc) {
    if (c) cache_.emplace(std::move(c), ioc);
  }
  /// The cache's block size (requests should stay inside blocks), 0 without one.
  [[nodiscard]] std::uint64_t read_alignment() const noexcept {
    return cache_ ? cache_->cache().opts().block_size : 0;
  }

  /// Reads up to dst.size() bytes at `offset` of file `file` into `dst` with
  /// one range GET (body read straight into `dst`), or through the cache.
  /// Returns the count: fewer only at the end of the object, 0 at or past
  /// it. `dst` must stay valid until the task completes (or cancel() ends it).
  [[nodiscard]] task<std::size_t> read_at(std::uint32_t file, std::uint64_t offset, std::span<std::byte> dst) {
    const s3::object_info pinned = co_await info(file);
    if (offset >= pinned.size || dst.empty()) co_return 0;
    dst = dst.first(static_cast<std::size_t>(std::min<std::uint64_t>(dst.size(), pinned.size - offset)));
    if (auto* e = cached(file, pinned)) {
      // Named, not temporaries of the co_await: g++ 12 destroys such
      // temporaries twice.
      auto fetch = [this, file, etag = pinned.etag](std::uint64_t at, std::span<std::byte> to) {
        return get(file, at, to, etag);
      };
      auto stopped = [this] { return client_->cancelled(); };
      const auto n = co_await cache_->read(*e, offset, dst, std::move(fetch), stopped, counters_);
      counters_.bytes_read += n;
      co_return n;
    }
    const auto n = co_await get(file, offset, dst, pinned.etag);
    counters_.bytes_read += n;
    co_return n;
  }

  [[nodiscard]] std::size_t file_count() const noexcept { return files_.size(); }
  [[nodiscard]] std::string file_uri(std::uint32_t file) const { return files_.at(file).uri; }
  [[nodiscard]] const io_counters& counters() const noexcept { return counters_; }
  /// The pinned size, once known.
  [[nodiscard]] std::optional<std::uint64_t> file_size(std::uint32_t file) const {
    std::lock_guard lock(mutex_);
    const auto& i = files_.at(file).info;
    return i ? std::optional(i->size) : std::nullopt;
  }
  [[nodiscard]] s3::client& client() noexcept { return *client_; }
  /// Connections of its client's pool.
  [[nodiscard]] std::size_t connections() const noexcept { return client_->cfg().max_connections; }

 private:
  struct file {
    std::string bucket, key, uri;
    std::optional<s3::object_info> info;
    std::shared_ptr<cache::entry> entry;
    bool entry_opened = false;
  };

  // The pinned info of `index`, HEADing it the first time. Concurrent first
  // reads may HEAD twice; differing ETags mean the object changed.
  [[nodiscard]] task<s3::object_info> info(std::uint32_t index) {
    {
      std::lock_guard lock(mutex_);
      if (index >= files_.size())
        throw config_error(fmt::format("s3_source: file index {} out of range ({} files)", index, files_.size()));
      if (files_[index].info) co_return *files_[index].info;
    }
    const auto& f = files_[index];
    s3::object_info seen = co_await client_->head(f.bucket, f.key);
    ++counters_.files_opened;
    std::lock_guard lock(mutex_);
    auto& slot = files_[index].info;
    if (!slot) {
      slot = seen;
    } else if (slot->etag != seen.etag) {
      s3::client& c = *client_;
      s3_error_info e{"HEAD", c.cfg().endpoint.url(), f.bucket, f.key, std::nullopt, 200, "ObjectChanged",
                      fmt::format("ETag is now {}, was {} when first seen", seen.etag, slot->etag), 1,
                      c.cfg().retry.max_attempts};
      throw s3_object_changed_error(std::move(e));
    }
    co_return *slot;
  }

  // One range GET (retried and resumed by the client), counted.
  task<std::size_t> get(std::uint32_t file, std::uint64_t offset, std::span<std::byte> dst, std::string etag) {
    const auto& f = files_[file];
    auto r = co_await client_->get_range(f.bucket, f.key, offset, dst, std::move(etag));
    counters_.requests += r.attempts;
    counters_.retries += r.attempts - 1;
    co_return r.bytes;
  }

  // The cache's entry for `file` (opened at its first read), or null without
  // a cache or for an object without an ETag.
  cache::entry* cached(std::uint32_t file, const s3::object_info& pinned) {
    if (!cache_) return nullptr;
    std::lock_guard lock(mutex_);
    auto& f = files_[file];
    if (!f.entry_opened) {
      f.entry = cache_->cache().open({client_->cfg().endpoint.url(), f.bucket, f.key, pinned.etag, pinned.size});
      f.entry_opened = true;
    }
    return f.entry.get();
  }

  std::shared_ptr<s3::client> client_;
  std::vector<file> files_;
  mutable std::mutex mutex_;
  io_counters counters_;
  std::optional<cache::reader> cache_;
};

static_assert(source<s3_source>);

/// Metadata access to `s3://bucket/prefix/`: lists the objects directly under
/// the prefix (ListObjectsV2 with delimiter '/'), sizes them (HEAD), reads
/// them (range GETs). Synchronous: it runs its own io_context on the calling
/// thread. `read_prefix` makes one speculative GET of at least 1 MiB and
/// serves later header reads of that object from it. Each object is pinned
/// to the ETag first seen; `object_info()` hands the pins to an s3_source.
/// Errors: the s3_error family (io_error), config_error for a malformed URI.
class s3_catalog final : public catalog {
 public:
  /// An s3_source with a client of its own on `ioc` (rank_connections(
  /// max_connections, sizing) connections, the rest of this catalog's
  /// config), every object pinned to the ETag this catalog saw (HEADing, on
  /// the calling thread, one it has not seen yet). Its preferred depth is
  /// twice its connections (or opt.queue_depth if larger): fetch releases
  /// results in order, so with depth == connections an early-finishing GET
  /// would leave its connection idle until the oldest one completes (see
  /// bench/README.md, bench-s3). Extents below 1 MiB are staged and merged
  /// (every GET costs a round trip). Compiled in src/s3/open_source.cpp.
  [[nodiscard]] std::unique_ptr<any_source> open_source(const checkpoint& ck, asio::io_context& ioc,
                                                        const source_options& opt, const reader_sizing& sizing) override;
  /// Extents smaller than this are read through a staging slot and merged
  /// with file-adjacent ones into one GET (any_source::stage_below).
  static constexpr std::uint64_t staged_below = std::uint64_t{1} << 20;

  /// Bytes fetched by the first read_prefix() of an object.
  static constexpr std::uint64_t speculative_prefix = 1 << 20;

  /// `uri` is "s3://bucket/prefix" (a trailing '/' is added when missing).
  /// With `cfg.cache` set, opens the node-local cache (config_error for a
  /// directory that is not this user's own) and reads through it.
  explicit s3_catalog(std::string uri, s3::config cfg = s3::config::from_environment())
      : client_(std::make_unique<s3::client>(ioc_.get_executor(), std::move(cfg))) {
    if (auto c = cache::block_cache::shared(client_->cfg().cache)) cache_.emplace(std::move(c), ioc_);
    auto u = s3::object_uri::parse(uri);
    bucket_ = std::move(u.bucket);
    prefix_ = std::move(u.key);
    if (!prefix_.empty() && prefix_.back() != '/') prefix_ += '/';
  }

  [[nodiscard]] std::string location() const override { return "s3://" + bucket_ + "/" + prefix_; }
  [[nodiscard]] std::string uri(const std::string& name) const override { return location() + name; }

  [[nodiscard]] std::vector<std::string> list() override {
    auto r = run_blocking(ioc_, client_->list(bucket_, prefix_, "/"));
    ++counters_.requests;
    listed_ = true;
    std::vector<std::string> names;
    for (auto& o : r.objects) {
      if (o.key.size() <= prefix_.size()) continue;   // the "directory" marker itself
      auto name = o.key.substr(prefix_.size());
      infos_.try_emplace(name, s3::object_info{o.size, o.etag});
      names.push_back(std::move(name));
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  /// From the listing (made now if none was: one request names every
  /// object's size and ETag, where a HEAD per object would name one); a HEAD
  /// for a name below a further '/', or where listing is refused (a key
  /// allowed GetObject but not ListBucket, a plain HTTP server).
  [[nodiscard]] bool exists(const std::string& name) override {
    if (!listed_ && !unlisted_ && name.find('/') == std::string::npos) {
      try {
        (void)list();
      } catch (const s3_error&) {
        unlisted_ = true;   // the HEAD below says what is wrong, if anything
      }
    }
    if (listed_ && name.find('/') == std::string::npos) return infos_.count(name) > 0;
    try {
      (void)object_info(name);
      return true;
    } catch (const s3_not_found_error&) {
      return false;
    }
  }

  [[nodiscard]] std::uint64_t size(const std::string& name) override { return object_info(name).size; }
  /// The ETag the catalog pinned (from the listing, a HEAD or a GET).
  [[nodiscard]] std::optional<std::string> etag(const std::string& name) override { return object_info(name).etag; }

  [[nodiscard]] std::vector<std::byte> read(const std::string& name, std::uint64_t offset,
                                            std::uint64_t length) override {
    if (auto it = prefixes_.find(name); it != prefixes_.end()) {
      const auto& [bytes, whole] = it->second;
      if (offset + length <= bytes.size() || (whole && offset <= bytes.size())) {
        auto n = std::min<std::uint64_t>(length, bytes.size() - std::min<std::uint64_t>(offset, bytes.size()));
        return {bytes.begin() + static_cast<std::ptrdiff_t>(offset),
                bytes.begin() + static_cast<std::ptrdiff_t>(offset + n)};
      }
    }
    return fetch(name, offset, length);
  }

  [[nodiscard]] std::vector<std::byte> read_prefix(const std::string& name, std::uint64_t length) override {
    if (auto f = prefetch_failures_.find(name); f != prefetch_failures_.end()) {
      const auto e = f->second;
      prefetch_failures_.erase(f);  // thrown once: asked again, the object is fetched again
      std::rethrow_exception(e);
    }
    if (!prefixes_.count(name)) {
      const std::uint64_t want = std::max(length, speculative_prefix);
      auto bytes = fetch(name, 0, want);
      const bool whole = bytes.size() < want;
      prefixes_[name] = {std::move(bytes), whole};
    }
    return read(name, 0, length);
  }

  void forget_prefixes() override {
    prefixes_.clear();
    prefetch_failures_.clear();
  }
  /// Bytes of speculative prefixes this catalog holds (none once an open is done with them).
  [[nodiscard]] std::uint64_t held_prefix_bytes() const noexcept {
    std::uint64_t n = 0;
    for (const auto& [name, p] : prefixes_) n += p.first.size();
    return n;
  }

  /// The speculative prefixes of `names` (those not fetched yet and, once
  /// listed, those the listing has), fetched concurrently: at most the
  /// client's connections at once. Opening a checkpoint of N shards then
  /// waits about N / connections round trips for its headers instead of N
  /// (a 163-shard DeepSeek V3 from S3: 163 GETs of 1 MiB one after another
  /// before). A GET that fails is kept and thrown by read_prefix(name); a
  /// cancellation (the client's cancel) is thrown here.
  void prefetch_prefixes(const std::vector<std::string>& names) override {
    std::vector<const std::string*> todo;
    for (const auto& n : names) {
      if (prefixes_.count(n) || prefetch_failures_.count(n)) continue;
      if (listed_ && n.find('/') == std::string::npos && !infos_.count(n)) continue;  // not there: the opener says so
      todo.push_back(&n);
    }
    if (todo.size() < 2) return;  // one GET gains nothing from running beside none
    run_blocking(ioc_, prefetch_all(std::move(todo)));
  }

  /// Pins `name` to the size and ETag the opening rank saw (no HEAD): this
  /// catalog's data paths then read that version or fail with
  /// s3_object_changed_error.
  void adopt(const std::string& name, std::uint64_t size, const std::optional<std::string>& etag) override {
    infos_.insert_or_assign(name, s3::object_info{size, etag.value_or(std::string())});
  }

  /// Size and ETag of `name` (HEAD once, from the listing, or adopted).
  [[nodiscard]] s3::object_info object_info(const std::string& name) {
    if (auto it = infos_.find(name); it != infos_.end()) return it->second;
    return run_blocking(ioc_, object_info_async(name));
  }

  [[nodiscard]] const std::string& bucket() const noexcept { return bucket_; }
  [[nodiscard]] const std::string& prefix() const noexcept { return prefix_; }
  [[nodiscard]] const s3::config& cfg() const noexcept { return client_->cfg(); }
  /// The node-local cache this catalog and its sources read through (null: none).
  [[nodiscard]] std::shared_ptr<cache::block_cache> cache() const { return cache_ ? cache_->shared() : nullptr; }

 private:
  std::vector<std::byte> fetch(const std::string& name, std::uint64_t offset, std::uint64_t length) {
    return run_blocking(ioc_, fetch_async(name, offset, length));
  }

  // The reads of this catalog, as tasks on ioc_ (one thread: the maps below
  // need no lock, and no reference into them is held across a co_await
  // except std::map's, which insertions leave valid).
  task<std::vector<std::byte>> fetch_async(std::string name, std::uint64_t offset, std::uint64_t length) {
    if (cache_) {
      // Through the cache: the object's version first (listing, adopted, or
      // the first block's GET, which the cache keeps).
      if (!infos_.count(name)) co_await first_block(name);
      const auto info = co_await object_info_async(name);
      auto& e = entries_[name];
      if (!e) e = cache_->cache().open({cfg().endpoint.url(), bucket_, prefix_ + name, info.etag, info.size});
      if (e) {
        if (offset >= info.size) co_return std::vector<std::byte>{};
        std::vector<std::byte> out(std::min<std::uint64_t>(length, info.size - offset));
        auto fetch = [this, key = prefix_ + name, etag = info.etag](std::uint64_t at, std::span<std::byte> to) {
          return get_counted(key, at, to, etag);
        };
        auto stopped = [this] { return client_->cancelled(); };
        const auto n = co_await cache_->read(*e, offset, out, std::move(fetch), stopped, counters_);
        counters_.bytes_read += n;
        out.resize(n);
        co_return out;
      }
    }
    std::string etag;
    if (auto it = infos_.find(name); it != infos_.end()) etag = it->second.etag;
    std::vector<std::byte> out(length);
    auto r = co_await client_->get_range(bucket_, prefix_ + name, offset, out, etag);
    counters_.requests += r.attempts;
    counters_.retries += r.attempts - 1;
    counters_.bytes_read += r.bytes;
    out.resize(r.bytes);
    if (r.bytes > 0 || r.object_size > 0) infos_.try_emplace(name, s3::object_info{r.object_size, r.etag});
    co_return out;
  }

  task<s3::object_info> object_info_async(std::string name) {
    if (auto it = infos_.find(name); it != infos_.end()) co_return it->second;
    auto info = co_await client_->head(bucket_, prefix_ + name);
    ++counters_.requests;
    ++counters_.files_opened;
    co_return infos_.emplace(name, std::move(info)).first->second;
  }

  // An object this catalog knows nothing of yet (no listing): GETs its first
  // block unpinned (the response names size and ETag; no HEAD) and hands it
  // to the cache as that block's fetch (the reader's one rule: lock, verify
  // what is there, else write these bytes), where the read that asked finds it.
  task<void> first_block(std::string name) {
    const auto bs = cache_->cache().opts().block_size;
    std::vector<std::byte> bytes(static_cast<std::size_t>(bs));
    auto r = co_await client_->get_range(bucket_, prefix_ + name, 0, bytes, {});
    counters_.requests += r.attempts;
    counters_.retries += r.attempts - 1;
    infos_.try_emplace(name, s3::object_info{r.object_size, r.etag});
    auto& e = entries_[name];
    if (!e) e = cache_->cache().open({cfg().endpoint.url(), bucket_, prefix_ + name, r.etag, r.object_size});
    if (!e || r.bytes != e->block_length(0)) co_return;
    auto fetched = [&bytes](std::uint64_t, std::span<std::byte> to) -> task<std::size_t> {
      std::memcpy(to.data(), bytes.data(), to.size());
      co_return to.size();
    };
    auto stopped = [this] { return client_->cancelled(); };
    std::vector<std::byte> block(r.bytes);
    (void)co_await cache_->read(*e, 0, block, std::move(fetched), stopped, counters_);
  }

  // prefetch_prefixes: workers, as many as the client has connections (or
  // names), each taking the next name until none is left.
  task<void> prefetch_all(std::vector<const std::string*> todo) {
    std::size_t next = 0;
    const auto ex = co_await this_executor;
    std::exception_ptr stop;  // a cancellation, thrown once every worker has ended
    const auto n = std::min<std::size_t>(todo.size(), std::max<std::size_t>(1, cfg().max_connections));
    std::vector<std::unique_ptr<joined_spawn>> workers;
    workers.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
      workers.push_back(std::make_unique<joined_spawn>(ex, prefetch_worker(todo, next), [&stop](std::exception_ptr e) {
        if (e && !stop) stop = e;
      }));
    for (auto& w : workers) co_await w->join();
    if (stop) std::rethrow_exception(stop);
  }

  // After the first failure no worker starts another GET: a server that
  // fails every request fails the open after about one round of GETs (with
  // the client's retries), not after every shard's; the opener fetches
  // whatever it still asks for before the failed shard itself.
  task<void> prefetch_worker(const std::vector<const std::string*>& todo, std::size_t& next) {
    for (;;) {
      if (next >= todo.size() || !prefetch_failures_.empty() || client_->cancelled()) co_return;
      const std::string& name = *todo[next++];
      std::exception_ptr failed;
      try {
        auto bytes = co_await fetch_async(name, 0, speculative_prefix);
        const bool whole = bytes.size() < speculative_prefix;
        prefixes_[name] = {std::move(bytes), whole};
      } catch (const cancelled_error&) {
        throw;
      } catch (...) {
        failed = std::current_exception();
      }
      if (failed) prefetch_failures_[name] = failed;
    }
  }

  task<std::size_t> get_counted(std::string key, std::uint64_t at, std::span<std::byte> to, std::string etag) {
    auto r = co_await client_->get_range(bucket_, std::move(key), at, to, std::move(etag));
    counters_.requests += r.attempts;
    counters_.retries += r.attempts - 1;
    co_return r.bytes;
  }

  asio::io_context ioc_{1};
  std::unique_ptr<s3::client> client_;
  std::string bucket_, prefix_;
  std::map<std::string, s3::object_info> infos_;
  std::map<std::string, std::pair<std::vector<std::byte>, bool>> prefixes_;
  std::map<std::string, std::exception_ptr> prefetch_failures_;  // prefetch_prefixes' failed GETs, until asked for
  std::optional<cache::reader> cache_;
  std::map<std::string, std::shared_ptr<cache::entry>> entries_;
  bool listed_ = false, unlisted_ = false;
};

/// An S3 location whose catalog uses `cfg` (made when the location is
/// opened, e.g. after a distributed load joined its world).
[[nodiscard]] inline location s3_location(std::string uri, s3::config cfg) {
  auto u = uri;
  return location(std::move(u), [uri = std::move(uri), cfg = std::move(cfg)] { return std::make_shared<s3_catalog>(uri, cfg); });
}

}  // namespace sluice::inline v0
