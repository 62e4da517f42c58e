// The node-local cache's directory (cache/block_cache.hpp): identities,
// block files and their trailers, OFD locks, publication by rename, eviction.
#include <sluice/cache/block_cache.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include <fmt/format.h>

#include <sluice/comm/store.hpp>
#include <sluice/distributed/fault.hpp>
#include <sluice/source/page_cache.hpp>

namespace sluice::inline v0::cache {

namespace fs = std::filesystem;

namespace {

constexpr std::array<char, 8> magic{'S', 'L', 'U', 'I', 'C', 'E', 'B', '1'};
constexpr std::size_t identity_cap = 64 << 10;  // an identity file larger than this is not ours

// Length-prefixed fields: no key, ETag or endpoint can make two identities equal.
std::string fields(std::initializer_list<std::string_view> fs_) {
  std::string s;
  for (auto f : fs_) s += fmt::format("{}:{}\n", f.size(), f);
  return s;
}

std::string hex128(const std::string& s) {
  const XXH128_hash_t h = XXH3_128bits(s.data(), s.size());
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

void put64(std::byte* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
std::uint64_t get64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t(std::to_integer<unsigned>(p[i])) << (8 * i);
  return v;
}

// The trailer: magic, index, length, block size, identity hash, data hash,
// then the XXH3 of those 56 bytes (a torn or flipped trailer is caught too).
std::array<std::byte, block_trailer::size> encode(const block_trailer& t) {
  std::array<std::byte, block_trailer::size> b{};
  std::memcpy(b.data(), magic.data(), magic.size());
  put64(b.data() + 8, t.index);
  put64(b.data() + 16, t.length);
  put64(b.data() + 24, t.block_size);
  put64(b.data() + 32, t.identity);
  put64(b.data() + 40, t.hash);
  put64(b.data() + 48, XXH3_64bits(b.data(), 48));
  return b;
}

// A file this cache reads must be this user's, 0600 at most.
void check_private_file(int fd, const std::string& path) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) throw io_error(fmt::format("cannot examine the cache file: {}", std::strerror(errno)), {path}, errno);
  const auto mode = st.st_mode & 07777;
  if (st.st_uid != ::geteuid() || (mode & 077) != 0 || !S_ISREG(st.st_mode))
    throw config_error(fmt::format("the cache file '{}' is {} with mode {:04o}: a cache file must be this user's "
                                   "(uid {}) regular file with mode 0600 (someone else could change what it serves; "
                                   "remove the cache directory or chmod 600 it)",
                                   path, st.st_uid == ::geteuid() ? "this user's" : fmt::format("uid {}'s", st.st_uid),
                                   mode, ::geteuid()));
}

bool set_lock(int fd, short type, std::uint64_t start, std::uint64_t len) {
  struct flock fl{};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = static_cast<off_t>(start);
  fl.l_len = static_cast<off_t>(len);
  return ::fcntl(fd, F_OFD_SETLK, &fl) == 0;
}

int open_lock_file(const std::string& dir) {
  const auto path = dir + "/lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) throw io_error(fmt::format("cannot open the cache's lock file: {}", std::strerror(errno)), {path}, errno);
  try {
    check_private_file(fd, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  return fd;
}

bool write_all(int fd, const std::byte* p, std::size_t n) {
  while (n > 0) {
    const auto w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

std::atomic<std::uint64_t> temp_serial{0};

struct timer {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  [[nodiscard]] std::uint64_t ns() const {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  }
};

}  // namespace

block_lock& block_lock::operator=(block_lock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}
block_lock::~block_lock() {
  if (fd_ >= 0) ::close(fd_);
}

block_file::~block_file() {
  if (fd >= 0) ::close(fd);
  if (direct_fd >= 0) ::close(direct_fd);
}

// ---- entry ---------------------------------------------------------------------

entry::entry(block_cache& owner, object_id id, std::string dir, std::uint64_t identity_hash)
    : owner_(&owner), id_(std::move(id)), dir_(std::move(dir)), identity_hash_(identity_hash),
      block_size_(owner.opts().block_size) {}

std::string entry::block_path(std::uint64_t b) const { return fmt::format("{}/{}.blk", dir_, b); }

block_lock entry::try_lock(std::uint64_t b, bool exclusive) const {
  const int fd = open_lock_file(dir_);
  if (!set_lock(fd, exclusive ? F_WRLCK : F_RDLCK, b, 1)) {
    const int e = errno;
    ::close(fd);
    if (e == EAGAIN || e == EACCES) return {};
    throw io_error(fmt::format("cannot lock block {} of the cache: {}", b, std::strerror(e)), {dir_ + "/lock"}, e);
  }
  return block_lock(fd);
}

std::optional<block_file> entry::open_block(std::uint64_t b, bool direct_if_cold, std::string& why) const {
  const auto path = block_path(b);
  block_file f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (f.fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw io_error(fmt::format("cannot open the cache block: {}", std::strerror(errno)), {path}, errno);
  }
  check_private_file(f.fd, path);
  struct stat st{};
  (void)::fstat(f.fd, &st);
  const auto want = block_length(b) + block_trailer::size;
  if (static_cast<std::uint64_t>(st.st_size) != want) {
    why = fmt::format("it holds {} bytes, a block of {} bytes and its trailer take {}", st.st_size, block_length(b), want);
    return std::nullopt;
  }
  if (direct_if_cold && !detail::mostly_cached(f.fd, 0, block_length(b)))
    f.direct_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_DIRECT);
  return f;
}

bool entry::verify(std::uint64_t b, std::span<const std::byte> data, std::span<const std::byte> trailer,
                   std::string& why) const {
  if (trailer.size() != block_trailer::size || std::memcmp(trailer.data(), magic.data(), magic.size()) != 0) {
    why = "its trailer is not a sluice block trailer";
    return false;
  }
  if (get64(trailer.data() + 48) != XXH3_64bits(trailer.data(), 48)) {
    why = "its trailer's checksum does not match";
    return false;
  }
  const block_trailer t{get64(trailer.data() + 8), get64(trailer.data() + 16), get64(trailer.data() + 24),
                        get64(trailer.data() + 32), get64(trailer.data() + 40)};
  if (t.index != b || t.length != data.size() || t.block_size != block_size_ || t.identity != identity_hash_) {
    why = fmt::format("its trailer describes block {} of {} bytes (block size {}) of another version", t.index, t.length,
                      t.block_size);
    return false;
  }
  if (const auto h = hash(data); h != t.hash) {
    why = fmt::format("its bytes hash to {:016x}, {:016x} when written", h, t.hash);
    return false;
  }
  return true;
}

void entry::touch(const block_file& f) const noexcept { (void)::futimens(f.fd, nullptr); }

std::uint64_t entry::hash(std::span<const std::byte> data) const {
  const timer t;
  const auto h = XXH3_64bits(data.data(), data.size());
  auto& c = owner_->stats();
  c.hash_ns += t.ns();
  c.hashed_bytes += data.size();
  return h;
}

bool entry::publish(std::uint64_t b, std::span<const std::byte> data, std::uint64_t h) {
  const auto total = data.size() + block_trailer::size;
  auto& c = owner_->stats();
  if (!owner_->make_room(total)) {
    ++c.unwritten_blocks;
    return false;
  }
  const auto tmp = fmt::format("{}/tmp.{}.{}.{}", dir_, b, ::getpid(), temp_serial++);
  // A whole, aligned block is written with O_DIRECT: no copy into the page
  // cache (a first load of a large model would otherwise fill it with blocks
  // that the load itself never reads back). The trailer is written buffered.
  const bool direct = reinterpret_cast<std::uintptr_t>(data.data()) % 4096 == 0 && data.size() % 4096 == 0;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW | (direct ? O_DIRECT : 0), 0600);
  if (fd < 0 && direct && errno == EINVAL)   // a file system without O_DIRECT
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  auto fail = [&](const char* step, bool close_it) {
    const int e = errno;
    if (close_it && fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    ++c.unwritten_blocks;
    owner_->written(total, false);
    owner_->report(fmt::format("block {} of {} not cached: {} failed: {}", b, id_.key, step, std::strerror(e)));
    return false;
  };
  if (fd < 0) return fail("creating its file", false);
  const auto trailer = encode({b, data.size(), block_size_, identity_hash_, h});
  // Half the bytes, then the test fault point (a writer killed mid-block), then the rest.
  const auto half = data.size() / 2 / 4096 * 4096;   // (aligned for O_DIRECT)
  if (!write_all(fd, data.data(), half)) return fail("writing", true);
  detail::fault_point("cache-write", owner_->next_write());
  if (!write_all(fd, data.data() + half, data.size() - half)) return fail("writing", true);
  if (direct) (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_DIRECT);
  if (!write_all(fd, trailer.data(), trailer.size())) return fail("writing", true);
  if (::fsync(fd) != 0) return fail("fsync", true);
  if (::close(fd) != 0) return fail("close", false);
  if (::rename(tmp.c_str(), block_path(b).c_str()) != 0) return fail("rename", false);
  owner_->written(total, true);
  ++c.written_blocks;
  return true;
}

void entry::discard(std::uint64_t b) const {
  ::unlink(block_path(b).c_str());
  const auto prefix = fmt::format("tmp.{}.", b);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec))
    if (e.path().filename().string().starts_with(prefix)) fs::remove(e.path(), ec);
}

// ---- block_cache -----------------------------------------------------------------

block_cache::block_cache(options opt, std::shared_ptr<counters> shared_counters)
    : opt_(std::move(opt)), counters_(shared_counters ? std::move(shared_counters) : std::make_shared<counters>()) {
  if (opt_.dir.empty()) throw config_error("the cache directory is empty");
  if (opt_.block_size == 0 || opt_.block_size % 4096 != 0)
    throw config_error(fmt::format("the cache's block size {} is not a positive multiple of 4096", opt_.block_size));
  comm::make_private_dir(opt_.dir);
  comm::check_private_dir(opt_.dir, "cache directory");
  bytes_ = scan();
}

block_cache::~block_cache() { workers_.join(); }

namespace {
std::mutex registry_mutex;
std::optional<block_cache::usage> last;
}  // namespace

std::optional<block_cache::usage> block_cache::last_used() {
  std::lock_guard lock(registry_mutex);
  return last;
}

std::shared_ptr<block_cache> block_cache::shared(const options& opt) {
  if (opt.dir.empty()) return nullptr;
  static std::map<std::string, std::weak_ptr<block_cache>> caches;
  static std::map<std::string, std::shared_ptr<counters>> counted;
  std::lock_guard lock(registry_mutex);
  std::error_code ec;
  auto key = fs::weakly_canonical(opt.dir, ec).string();
  if (ec) key = opt.dir;
  auto c = caches[key].lock();
  if (!c) {
    auto& n = counted[key];
    if (!n) n = std::make_shared<counters>();
    c = std::make_shared<block_cache>(opt, n);
    caches[key] = c;
  }
  last = usage{c->opts().dir, c->counters_};
  return c;
}

std::shared_ptr<entry> block_cache::open(const object_id& id) {
  if (id.etag.empty()) return nullptr;
  const auto identity = fields({"sluice-cache-v1", id.endpoint, id.bucket, id.key, id.etag, std::to_string(id.size),
                                std::to_string(opt_.block_size)});
  const auto object_dir = fmt::format("{}/v1/{}", opt_.dir, hex128(fields({id.endpoint, id.bucket, id.key})));
  const auto version = hex128(identity);
  const auto dir = object_dir + "/" + version;
  comm::make_private_dir(dir);
  // Other versions of the object: stale from now on (unless someone holds a block).
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(object_dir, ec)) {
    if (e.path().filename() == version) continue;
    const int fd = ::open((e.path() / "lock").c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0 && !set_lock(fd, F_WRLCK, 0, 0)) {
      ::close(fd);
      continue;
    }
    std::uint64_t freed = 0;
    for (const auto& f : fs::directory_iterator(e.path(), ec))
      if (f.path().extension() == ".blk") freed += f.file_size(ec) ;
    fs::remove_all(e.path(), ec);
    if (fd >= 0) ::close(fd);
    bytes_ -= std::min<std::uint64_t>(bytes_, freed);
  }
  // The identity: written once, and what every later open must find.
  const auto ipath = dir + "/identity";
  const int fd = ::open(ipath.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd >= 0) {
    std::string seen(identity_cap, '\0');
    check_private_file(fd, ipath);
    const auto n = ::pread(fd, seen.data(), seen.size(), 0);
    ::close(fd);
    if (n < 0 || static_cast<std::size_t>(n) != identity.size() || seen.compare(0, identity.size(), identity) != 0) {
      report(fmt::format("'{}' does not describe s3://{}/{} as ETag {}: its blocks are not served", ipath, id.bucket,
                         id.key, id.etag));
      return nullptr;
    }
  } else {
    const auto tmp = fmt::format("{}.{}.{}", ipath, ::getpid(), temp_serial++);
    const int w = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    const bool ok = w >= 0 && write_all(w, reinterpret_cast<const std::byte*>(identity.data()), identity.size()) &&
                    ::fsync(w) == 0;
    if (w >= 0) ::close(w);
    if (!ok || ::rename(tmp.c_str(), ipath.c_str()) != 0) {
      ::unlink(tmp.c_str());
      throw io_error(fmt::format("cannot write the cache's identity file: {}", std::strerror(errno)), {ipath}, errno);
    }
  }
  return std::make_shared<entry>(*this, id, dir, XXH3_64bits(identity.data(), identity.size()));
}

void block_cache::report(const std::string& what) const {
  if (opt_.warn) opt_.warn(what);
  else std::fprintf(stderr, "sluice: cache %s: %s\n", opt_.dir.c_str(), what.c_str());
}

std::uint64_t block_cache::scan() const {
  std::uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(opt_.dir, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (it->path().extension() == ".blk") total += it->file_size(ec);
  return total;
}

bool block_cache::make_room(std::uint64_t incoming) {
  if (opt_.max_bytes == 0) return true;
  if (incoming > opt_.max_bytes) return false;
  std::lock_guard lock(evict_mutex_);
  if (bytes_ + incoming > opt_.max_bytes) {
    // Evict to 90% of the cap (less the block coming), so that a full cache
    // is scanned once per tenth of its size written, not once per block.
    trim_locked(std::min(opt_.max_bytes - incoming, opt_.max_bytes / 10 * 9));
    if (bytes_ + incoming > opt_.max_bytes) return false;
  }
  bytes_ += incoming;   // reserved: writers in parallel cannot both take the last room
  in_flight_ += incoming;
  return true;
}

void block_cache::written(std::uint64_t n, bool ok) noexcept {
  if (opt_.max_bytes == 0) {
    if (ok) bytes_ += n;
    return;
  }
  // Ended before it stops counting as in flight: trim_locked counts a block
  // that ends during its scan by one or the other (the order matters).
  ended_ += n;
  in_flight_ -= n;
  if (!ok) bytes_ -= n;
}

void block_cache::trim(std::uint64_t target) {
  std::lock_guard lock(evict_mutex_);   // no reservation (make_room) between its scan and its count
  trim_locked(target);
}

void block_cache::trim_locked(std::uint64_t target) {
  // The bytes this process's writers end during the scan: their files were
  // renamed into place before, during or after it (the directory iteration
  // may miss a name that appears while it runs), so they are counted
  // whether the scan saw them or not. Counting the in-flight bytes before
  // the second reading of ended_ leaves no block out (written() adds to
  // ended_ before it leaves in_flight_); one may count twice, which only
  // makes eviction a little early. Taking the count after the scan alone
  // missed a block renamed behind the iteration, and a busy machine then
  // went past the cap by that block (the cap test, 1 run in 24 under load).
  const auto ended_before = ended_.load();
  struct victim {
    fs::file_time_type when;
    std::uint64_t size;
    fs::path path;
  };
  std::vector<victim> blocks;
  std::uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(opt_.dir, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (name.starts_with("tmp.")) {   // a dead writer's, if its block's lock is free
      std::uint64_t index = 0;
      const int fd = std::sscanf(name.c_str(), "tmp.%lu.", &index) == 1
                         ? ::open((it->path().parent_path() / "lock").c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW)
                         : -1;
      if (fd >= 0 && set_lock(fd, F_WRLCK, index, 1)) ::unlink(it->path().c_str());
      if (fd >= 0) ::close(fd);
      continue;
    }
    if (it->path().extension() != ".blk") continue;
    const auto size = it->file_size(ec);
    const auto when = it->last_write_time(ec);
    if (ec) continue;
    total += size;
    blocks.push_back({when, size, it->path()});
  }
  std::sort(blocks.begin(), blocks.end(), [](const victim& a, const victim& b) { return a.when < b.when; });
  for (const auto& v : blocks) {
    if (total <= target) break;
    std::uint64_t index = 0;
    const auto stem = v.path.stem().string();
    if (std::sscanf(stem.c_str(), "%lu", &index) != 1) continue;
    const int fd = ::open((v.path.parent_path() / "lock").c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    if (set_lock(fd, F_WRLCK, index, 1) && ::unlink(v.path.c_str()) == 0) {
      total -= v.size;
      ++counters_->evicted_blocks;
    }
    ::close(fd);   // a block someone reads or writes is spared
  }
  const auto in_flight = in_flight_.load();   // blocks being written count as written
  bytes_ = total + in_flight + (ended_.load() - ended_before);
}

}  // namespace sluice::inline v0::cache
