// comm::nccl over NCCL's non-blocking communicator: every wait polls
// ncclCommGetAsyncError against a deadline and aborts on expiry.
#include <nccl.h>

#if SLUICE_NCCL_REDIS
#include <hiredis/hiredis.h>

#include "../core/redis_auth.hpp"
#endif
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <sluice/nccl/communicator.hpp>
#include <sluice/cuda/error.hpp>

namespace sluice::inline v0::comm {
namespace {
using clk = std::chrono::steady_clock;
static_assert(sizeof(ncclUniqueId) == std::tuple_size_v<nccl::unique_id>);

std::string describe(ncclResult_t r, ncclComm_t c = nullptr) {
  std::string s = fmt::format("{} ({})", ::ncclGetErrorString(r), static_cast<int>(r));
  if (c) {
    if (const char* last = ::ncclGetLastError(c); last && *last) s += fmt::format(": {}", last);
  } else if (const char* last = ::ncclGetLastError(nullptr); last && *last) {
    s += fmt::format(": {}", last);
  }
  return s;
}

void check(ncclResult_t r, const char* call, ncclComm_t c = nullptr) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  throw nccl_error(call, static_cast<int>(r), describe(r, c));
}

#if SLUICE_NCCL_REDIS
// The unique id through the same Redis store Gloo meets in
// (SLUICE_STORE=redis://HOST:PORT/PREFIX): SET, GET, DEL of one binary-safe
// value, with hiredis (the client Gloo's RedisStore uses). Connecting retries
// until the timeout (the server may come up after this rank); every command
// is bounded by it. Failures are comm_error naming the server.
class redis_client {
 public:
  redis_client(const store_address& a, std::chrono::milliseconds timeout)
      : where_(fmt::format("redis://{}:{}", a.redis_host, a.redis_port)) {
    const timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
    const auto deadline = clk::now() + timeout;
    for (;;) {
      ctx_.reset(::redisConnectWithTimeout(a.redis_host.c_str(), static_cast<int>(a.redis_port), tv));
      if (ctx_ && !ctx_->err) break;
      if (!ctx_) throw comm_error(fmt::format("NCCL rendezvous: cannot allocate a Redis context for {}", where_));
      if (clk::now() > deadline)
        throw comm_error(fmt::format("NCCL rendezvous: cannot connect to {} within {} ms: {}", where_, timeout.count(), ctx_->errstr));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (::redisSetTimeout(ctx_.get(), tv) != REDIS_OK)
      throw comm_error(fmt::format("NCCL rendezvous: cannot set a timeout on {}: {}", where_, ctx_->errstr));
    detail::redis_login(ctx_.get(), a.password, where_);
  }

  void set(std::string_view key, std::string_view value) {
    const auto r = command("SET %b %b", key.data(), key.size(), value.data(), value.size());
    if (r->type != REDIS_REPLY_STATUS) throw comm_error(fmt::format("NCCL rendezvous: {} refused SET: {}", where_, text(*r)));
  }
  // nullopt: no such key (yet).
  std::optional<std::string> get(std::string_view key) {
    const auto r = command("GET %b", key.data(), key.size());
    if (r->type == REDIS_REPLY_NIL) return std::nullopt;
    if (r->type != REDIS_REPLY_STRING) throw comm_error(fmt::format("NCCL rendezvous: {} refused GET: {}", where_, text(*r)));
    return std::string(r->str, r->len);
  }
  void del(std::string_view key) { (void)command("DEL %b", key.data(), key.size()); }

 private:
  struct free_context {
    void operator()(redisContext* c) const noexcept { ::redisFree(c); }
  };
  struct free_reply {
    void operator()(redisReply* r) const noexcept { ::freeReplyObject(r); }
  };
  using reply = std::unique_ptr<redisReply, free_reply>;

  template <class... Args>
  reply command(const char* format, Args... args) {
    reply r(static_cast<redisReply*>(::redisCommand(ctx_.get(), format, args...)));
    if (!r) throw comm_error(fmt::format("NCCL rendezvous: {} did not answer: {}", where_, ctx_->errstr));
    if (r->type == REDIS_REPLY_ERROR) throw comm_error(fmt::format("NCCL rendezvous: {} answered: {}", where_, text(*r)));
    return r;
  }
  static std::string text(const redisReply& r) { return r.str ? std::string(r.str, r.len) : fmt::format("reply type {}", r.type); }

  std::string where_;
  std::unique_ptr<redisContext, free_context> ctx_;
};

#else
// Built without hiredis: a Redis store is refused, naming what is missing.
class redis_client {
 public:
  redis_client(const store_address& a, std::chrono::milliseconds) {
    throw config_error(fmt::format("NCCL rendezvous through redis://{}:{} needs hiredis: sluice was built without "
                                   "libhiredis-dev (use SLUICE_STORE_DIR)", a.redis_host, a.redis_port));
  }
  void set(std::string_view, std::string_view) {}
  std::optional<std::string> get(std::string_view) { return std::nullopt; }
  void del(std::string_view) {}
};
#endif

std::string redis_key(const store_address& a) { return a.prefix.empty() ? "sluice-nccl-id" : a.prefix + "/sluice-nccl-id"; }
}  // namespace

// Polls of a pending NCCL operation sleep between tries, 20 µs doubling to
// 200 µs: a rank waiting on its peers leaves its core to the reads that
// overlap the exchange instead of spinning on it (a window's exchange takes
// milliseconds, so the added latency is noise).
class backoff {
 public:
  void pause() {
    std::this_thread::sleep_for(d_);
    d_ = std::min(d_ * 2, std::chrono::microseconds(200));
  }

 private:
  std::chrono::microseconds d_{20};
};

struct nccl::impl {
  ncclComm_t comm = nullptr;  // null once aborted
  cudaStream_t stream = nullptr;
  nccl_options opt;
  bool aborted = false;  // ncclCommAbort ran (after a failure, or asked): no collective may run any more

  ~impl() {
    if (comm) {  // not aborted: every failure aborts where it is detected
      (void)::ncclCommFinalize(comm);
      // Finalize is non-blocking on this communicator: wait (bounded) for it.
      const auto deadline = clk::now() + opt.timeout;
      ncclResult_t st = ncclInProgress;
      backoff b;
      while (::ncclCommGetAsyncError(comm, &st) == ncclSuccess && st == ncclInProgress && clk::now() < deadline) b.pause();
      if (st == ncclSuccess)
        (void)::ncclCommDestroy(comm);
      else
        abort();
    }
    // Does not block: the stream's resources go once its work is done (after
    // an abort, NCCL's kernels have exited).
    if (stream) (void)::cudaStreamDestroy(stream);
  }

  // NCCL's kernels spin until their peers arrive or the communicator is
  // aborted: every path that gives up on a collective aborts here first, so
  // that nothing waiting on the stream afterwards (the lane's drain, a
  // cudaFree that synchronizes the device) can hang on a dead peer.
  void abort() noexcept {
    if (comm) (void)::ncclCommAbort(comm);
    comm = nullptr;
    aborted = true;
  }

  // Aborts, then throws `e` (the message is built before the abort, while
  // the communicator can still say what went wrong).
  template <class Error>
  [[noreturn]] void fail(Error e) {
    abort();
    throw std::move(e);
  }

  // Asks nccl_options::liveness; what it throws aborts first.
  void alive() {
    if (!opt.liveness) return;
    try {
      opt.liveness();
    } catch (...) {
      abort();
      throw;
    }
  }

  void usable(const char* call) const {
    if (aborted)
      throw comm_error(fmt::format("{}: the NCCL communicator was aborted after an earlier failure (make a new one)", call));
  }

  // Waits until the communicator's pending operation (init, a call that
  // returned ncclInProgress) is done.
  void settle(const char* call) {
    const auto deadline = clk::now() + opt.timeout;
    backoff b;
    for (;;) {
      ncclResult_t st = ncclSuccess;
      if (const auto r = ::ncclCommGetAsyncError(comm, &st); r != ncclSuccess)
        fail(nccl_error("ncclCommGetAsyncError", static_cast<int>(r), describe(r, comm)));
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) fail(nccl_error(call, static_cast<int>(st), describe(st, comm)));
      if (clk::now() > deadline)
        fail(comm_error(fmt::format("{}: no completion within {} ms (a peer is gone or stalled)", call, opt.timeout.count())));
      alive();
      b.pause();
    }
  }

  void call(ncclResult_t r, const char* name) {
    if (r == ncclInProgress) return settle(name);
    if (r != ncclSuccess) fail(nccl_error(name, static_cast<int>(r), describe(r, comm)));
  }

  // Waits for `s`, watching the communicator for asynchronous errors; on an
  // error or at the deadline the communicator is aborted before the throw.
  void wait(cudaStream_t s, const char* what) {
    const auto deadline = clk::now() + opt.timeout;
    backoff b;
    for (;;) {
      const auto q = ::cudaStreamQuery(s);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        abort();
        cuda::check(q, "cudaStreamQuery", {fmt::format("NCCL {}", what)});
      }
      if (comm) {
        ncclResult_t st = ncclSuccess;
        (void)::ncclCommGetAsyncError(comm, &st);
        if (st != ncclSuccess && st != ncclInProgress) fail(nccl_error(what, static_cast<int>(st), describe(st, comm)));
      }
      if (clk::now() > deadline)
        fail(comm_error(fmt::format("NCCL {}: not complete within {} ms (a peer is gone or stalled)", what, opt.timeout.count())));
      alive();
      b.pause();
    }
  }

  // Waits for `s` without throwing, bounded: at the deadline the
  // communicator is aborted (its kernels then exit) and the wait goes on for
  // at most one more timeout. True when the stream is idle.
  bool drain(cudaStream_t s) noexcept {
    for (int round = 0; round < 2; ++round) {
      const auto deadline = clk::now() + opt.timeout;
      backoff b;
      while (clk::now() <= deadline) {
        const auto q = ::cudaStreamQuery(s);
        if (q != cudaErrorNotReady) return q == cudaSuccess;
        if (comm) {
          ncclResult_t st = ncclSuccess;
          (void)::ncclCommGetAsyncError(comm, &st);
          if (st != ncclSuccess && st != ncclInProgress) abort();
        }
        if (comm && opt.liveness) {
          try {
            opt.liveness();
          } catch (...) {  // a dead peer: its kernels will not finish
            abort();
          }
        }
        b.pause();
      }
      abort();
    }
    return false;
  }

  void broadcast(std::span<std::byte> buf, std::size_t root, cudaStream_t s) {
    const std::size_t chunk = opt.chunk_bytes ? opt.chunk_bytes : buf.size();
    for (std::size_t off = 0; off < buf.size(); off += chunk) {
      const std::size_t n = std::min(chunk, buf.size() - off);
      call(::ncclBroadcast(buf.data() + off, buf.data() + off, n, ncclUint8, static_cast<int>(root), comm, s),
           "ncclBroadcast");
    }
  }
};

nccl::unique_id nccl::make_unique_id() {
  ncclUniqueId id{};
  check(::ncclGetUniqueId(&id), "ncclGetUniqueId");
  unique_id out{};
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

std::string nccl::id_path(const rank_info& who) {
  return (std::filesystem::path(who.store_dir) / "sluice-nccl-id").string();
}

nccl nccl::connect(const rank_info& who, nccl_options opt) {
  opt.timeout = who.timeout;
  const auto id = exchange_id(who);
  // Rank 0 removes the id whether or not the communicator comes up: made, it
  // proves every rank has read the id; failed, nobody should use it again.
  struct remove_on_exit {
    const rank_info* who;
    ~remove_on_exit() {
      if (!who) return;
      const auto a = who->rendezvous();
      if (a.kv) return;  // the program's store: its keys are the program's to clean up (one prefix per load)
      try {
        if (a.redis()) {
          redis_client(a, who->timeout).del(redis_key(a));
        } else {
          std::error_code ec;
          std::filesystem::remove(id_path(*who), ec);
        }
      } catch (...) {  // best effort: the run itself is unaffected
      }
    }
  } cleanup{who.rank == 0 ? &who : nullptr};
  return nccl(who.rank, who.world_size, id, opt);
}

nccl::unique_id nccl::exchange_id(const rank_info& who) {
  if (const auto a = who.rendezvous(); a.kv) {
    // Through the program's key-value store (e.g. a torch.distributed store): rank 0 sets, the others get.
    const std::string key = a.prefix.empty() ? std::string("sluice-nccl-id") : a.prefix + "/sluice-nccl-id";
    unique_id id{};
    if (who.rank == 0) {
      id = make_unique_id();
      a.kv->set(key, std::vector<char>(reinterpret_cast<const char*>(id.data()), reinterpret_cast<const char*>(id.data()) + id.size()));
      return id;
    }
    const auto v = a.kv->get(key, who.timeout);
    if (v.size() != id.size())
      throw comm_error(fmt::format("NCCL rendezvous: the id under '{}' has {} bytes, expected {}", key, v.size(), id.size()));
    std::memcpy(id.data(), v.data(), id.size());
    return id;
  }
  if (const auto a = who.rendezvous(); a.redis()) {
    // Through the Redis store: rank 0 SETs the id under the run's prefix, the others poll GET.
    redis_client r(a, who.timeout);
    const auto key = redis_key(a);
    unique_id id{};
    if (who.rank == 0) {
      id = make_unique_id();
      r.set(key, std::string_view(reinterpret_cast<const char*>(id.data()), id.size()));
      return id;
    }
    const auto deadline = clk::now() + who.timeout;
    for (;;) {
      if (auto v = r.get(key); v && v->size() == id.size()) {
        std::memcpy(id.data(), v->data(), id.size());
        return id;
      }
      if (clk::now() > deadline)
        throw comm_error(fmt::format("NCCL rendezvous: rank 0 published no id within {} ms", who.timeout.count()),
                         {fmt::format("redis://{}:{}/{}", a.redis_host, a.redis_port, key)});
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  if (who.store_dir.empty())
    throw config_error("NCCL rendezvous: no store (SLUICE_STORE_DIR or SLUICE_STORE=redis://HOST:PORT/PREFIX)");
  // The id lets whoever reads it join the communicator: a directory of this user's own only.
  check_private_dir(who.store_dir);
  const std::filesystem::path path = id_path(who);
  unique_id id{};
  if (who.rank == 0) {
    id = make_unique_id();
    const auto tmp = path.string() + fmt::format(".tmp.{}", ::getpid());
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(id.data()), static_cast<std::streamsize>(id.size()));
      if (!f) throw io_error("cannot write the NCCL unique id", {tmp});
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);  // atomic: readers never see a partial id
    if (ec) throw io_error(fmt::format("cannot publish the NCCL unique id: {}", ec.message()), {path.string()}, ec.value());
    return id;
  }
  const auto deadline = clk::now() + who.timeout;
  for (;;) {
    std::ifstream f(path, std::ios::binary);
    if (f && f.read(reinterpret_cast<char*>(id.data()), static_cast<std::streamsize>(id.size()))) return id;
    if (clk::now() > deadline)
      throw comm_error(fmt::format("NCCL rendezvous: rank 0 published no id within {} ms", who.timeout.count()),
                       {path.string()});
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

nccl::nccl(std::size_t rank, std::size_t size, const unique_id& id, nccl_options opt)
    : impl_(std::make_unique<impl>()), rank_(rank), size_(size) {
  impl_->opt = opt;
  if (rank >= size) throw config_error(fmt::format("NCCL: rank {} is not below size {}", rank, size));
  cuda::check(::cudaSetDevice(opt.device), "cudaSetDevice", {fmt::format("device {} for NCCL rank {}", opt.device, rank)});
  cuda::check(::cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof nid);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  const auto r = ::ncclCommInitRankConfig(&impl_->comm, static_cast<int>(size), nid, static_cast<int>(rank), &cfg);
  if (r != ncclSuccess && r != ncclInProgress) impl_->fail(nccl_error("ncclCommInitRankConfig", static_cast<int>(r), describe(r)));
  impl_->settle("ncclCommInitRankConfig");
}

nccl::nccl(nccl&&) noexcept = default;
nccl& nccl::operator=(nccl&&) noexcept = default;
nccl::~nccl() = default;

cudaStream_t nccl::stream() const noexcept { return impl_ ? impl_->stream : nullptr; }
int nccl::device() const noexcept { return impl_ ? impl_->opt.device : -1; }
std::chrono::milliseconds nccl::timeout() const noexcept { return impl_ ? impl_->opt.timeout : std::chrono::milliseconds(0); }
void nccl::abort() noexcept {
  if (impl_) impl_->abort();
}
bool nccl::aborted() const noexcept { return !impl_ || impl_->aborted; }
bool nccl::drain(cudaStream_t s) noexcept { return impl_ ? impl_->drain(s) : true; }

void nccl::broadcast(std::span<std::byte> buf, std::size_t root) {
  impl_->usable("ncclBroadcast");
  impl_->broadcast(buf, root, impl_->stream);
  impl_->wait(impl_->stream, "ncclBroadcast");
}

void nccl::broadcast_async(std::span<std::byte> buf, std::size_t root, cudaStream_t s) {
  impl_->usable("ncclBroadcast");
  impl_->broadcast(buf, root, s);
}

void nccl::wait(cudaStream_t s) {
  impl_->usable("collective");
  impl_->wait(s, "collective");
}

void nccl::all_gather(std::span<const std::byte> in, std::span<std::byte> out) {
  impl_->usable("ncclAllGather");
  if (out.size() != in.size() * size_)
    throw config_error(fmt::format("NCCL all_gather: output holds {} bytes, expected {} x {}", out.size(), size_, in.size()));
  impl_->call(::ncclAllGather(in.data(), out.data(), in.size(), ncclUint8, impl_->comm, impl_->stream), "ncclAllGather");
  impl_->wait(impl_->stream, "ncclAllGather");
}

void nccl::all_gather_v(std::span<std::byte> buf, std::span<const std::size_t> counts) {
  impl_->usable("all_gather_v");
  if (counts.size() != size_) throw config_error(fmt::format("NCCL all_gather_v: {} counts for {} ranks", counts.size(), size_));
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  if (total > buf.size()) throw config_error(fmt::format("NCCL all_gather_v: counts sum to {} bytes, buffer holds {}", total, buf.size()));
  // One broadcast per rank's part, grouped: NCCL runs them as one operation.
  impl_->call(::ncclGroupStart(), "ncclGroupStart");
  std::size_t off = 0;
  for (std::size_t r = 0; r < size_; ++r) {
    if (counts[r])
      impl_->call(::ncclBroadcast(buf.data() + off, buf.data() + off, counts[r], ncclUint8, static_cast<int>(r),
                                  impl_->comm, impl_->stream),
                  "ncclBroadcast");
    off += counts[r];
  }
  impl_->call(::ncclGroupEnd(), "ncclGroupEnd");
  impl_->wait(impl_->stream, "all_gather_v");
}

void nccl::exchange(std::span<const send_message> sends, std::span<const recv_message> recvs) {
  for (const auto& m : sends)
    if (m.peer >= size_ || m.peer == rank_) throw config_error(fmt::format("NCCL exchange: rank {} cannot send to rank {}", rank_, m.peer));
  for (const auto& m : recvs)
    if (m.peer >= size_ || m.peer == rank_) throw config_error(fmt::format("NCCL exchange: rank {} cannot receive from rank {}", rank_, m.peer));
  impl_->usable("exchange");
  if (sends.empty() && recvs.empty()) return;
  // NCCL pairs a peer's sends with our receives in the order they are issued
  // within the group: both sides list their messages in the same (plan) order.
  impl_->call(::ncclGroupStart(), "ncclGroupStart");
  for (const auto& m : recvs)
    if (!m.bytes.empty())
      impl_->call(::ncclRecv(m.bytes.data(), m.bytes.size(), ncclUint8, static_cast<int>(m.peer), impl_->comm, impl_->stream),
                  "ncclRecv");
  for (const auto& m : sends)
    if (!m.bytes.empty())
      impl_->call(::ncclSend(m.bytes.data(), m.bytes.size(), ncclUint8, static_cast<int>(m.peer), impl_->comm, impl_->stream),
                  "ncclSend");
  impl_->call(::ncclGroupEnd(), "ncclGroupEnd");
  impl_->wait(impl_->stream, "exchange");
}

void nccl::barrier() {
  // An all-reduce of one int in device memory: returns when every rank reached it.
  impl_->usable("barrier");
  // The stream and the allocation are this rank's device's, whatever thread
  // calls: on a thread whose current device is another (0 by default), the
  // stream is an invalid handle there and a first call makes a context on GPU 0.
  cuda::check(::cudaSetDevice(impl_->opt.device), "cudaSetDevice",
              {fmt::format("device {} for the NCCL barrier", impl_->opt.device)});
  void* d = nullptr;
  cuda::check(::cudaMallocAsync(&d, sizeof(int), impl_->stream), "cudaMallocAsync", {"NCCL barrier"});
  cuda::check(::cudaMemsetAsync(d, 0, sizeof(int), impl_->stream), "cudaMemsetAsync", {"NCCL barrier"});
  try {
    impl_->call(::ncclAllReduce(d, d, 1, ncclInt32, ncclSum, impl_->comm, impl_->stream), "ncclAllReduce");
    (void)::cudaFreeAsync(d, impl_->stream);
    impl_->wait(impl_->stream, "barrier");
  } catch (...) {
    (void)::cudaFreeAsync(d, impl_->stream);
    throw;
  }
}

}  // namespace sluice::inline v0::comm
