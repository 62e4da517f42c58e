// The compiled part of sluice::gloo: everything that includes Gloo's headers.
#include <sluice/gloo/communicator.hpp>

#include <sluice/distributed/fault.hpp>

#include "../core/thread_name.hpp"
#include "peer_watch.hpp"

#include <sluice/comm/secret.hpp>

#include <netdb.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <exception>
#include <string>
#include <type_traits>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <gloo/allgather.h>
#include <gloo/common/error.h>
#include <gloo/allgatherv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/loop.h>
#include <gloo/transport/unbound_buffer.h>
#if defined(SLUICE_GLOO_REDIS)
#include <gloo/rendezvous/redis_store.h>

#include "../core/redis_auth.hpp"
#endif

namespace sluice::inline v0::comm {

using unbound_buffers = std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>>;

// Gloo's TCP loop wakes from epoll_wait every 10 ms, and a thread that
// removes a descriptor from it waits for its next wake
// (Loop::unregisterDescriptor: so that no handler runs after it returns):
// each pair's connecting side does so for its listening socket, each pair's
// teardown for its connection. 8 ranks spent 25-38 ms connecting their mesh
// and up to 80 ms closing it, every rank mostly idle (4 Python ranks: 17-44
// ms of a 0.6 s load closing). While the mesh connects and while it closes,
// a timer registered on the loop wakes it every 200 us, so each wait ends
// within that; in between it is disarmed and the loop sleeps as Gloo made it.
//
// The loop's first wake (an eventfd, written once when the ticker is
// attached) names its thread and takes it out of wakeup preemption
// (SCHED_BATCH, same weight). Why: Gloo's Pair::handleEvents only
// try-locks its pair and returns when another thread holds the lock, and
// the descriptor stays readable (level-triggered), so the loop spins in
// epoll_wait until that thread runs again. The holder is the thread that
// posts a collective's sends and receives (the pair's lock held across its
// writev); the message a peer sends back wakes this loop, which used to
// preempt the poster inside its post on a busy core, then spin for the rest
// of its time slice. 4 ranks on 2 cores: 70,000-98,000 loop wakes over 12
// rank-loads of the peers sample, 5,000-17,000 in batch; the loop thread's
// CPU about 10 ms per rank-load, 1.7 ms in batch; a 4-rank load of a
// 72-tensor checkpoint 0.06-0.08 s, 0.03 s in batch (bench/HISTORY.md). A
// core left idle still runs the loop at once: batch only declines to preempt.
class loop_ticker final : public ::gloo::transport::tcp::Handler {
 public:
  loop_ticker()
      : fd_(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)), hello_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~loop_ticker() override {
    if (fd_ >= 0) ::close(fd_);
    if (hello_ >= 0) ::close(hello_);
  }
  loop_ticker(const loop_ticker&) = delete;
  loop_ticker& operator=(const loop_ticker&) = delete;
  // Registers the timer and the first wake on `device`'s loop, and wakes it
  // (a descriptor that cannot be made or registered leaves the loop at its
  // own pace and name: slower, never wrong).
  void attach(::gloo::transport::Device& device) noexcept {
    auto* tcp = dynamic_cast<::gloo::transport::tcp::Device*>(&device);
    if (!tcp) return;
    try {
      if (fd_ >= 0) {
        tcp->registerDescriptor(fd_, EPOLLIN, this);
        attached_ = true;
      }
      if (hello_ >= 0) {
        tcp->registerDescriptor(hello_, EPOLLIN, this);
        const std::uint64_t one = 1;
        (void)!::write(hello_, &one, sizeof one);
      }
    } catch (...) {
    }
  }
  void run(bool on) noexcept {
    if (!attached_) return;
    itimerspec t{};
    if (on) t.it_value.tv_nsec = t.it_interval.tv_nsec = 200'000;
    (void)::timerfd_settime(fd_, 0, &t, nullptr);
  }
  // On the loop's thread: the wake is all a tick is for. Gloo does not say
  // which descriptor fired; both are non-blocking, and the first wake's is
  // read once (never written again, it does not fire again).
  void handleEvents(int) override {
    std::uint64_t count = 0;
    (void)!::read(fd_, &count, sizeof count);
    if (!greeted_) {
      greeted_ = true;
      (void)!::read(hello_, &count, sizeof count);
      // The thread was started by the one that made the device and took its
      // name (sluice-load, or the engine's): it is the Gloo loop.
      ::sluice::detail::name_this_thread("sluice-gloo");
      const sched_param p{};
      (void)::sched_setscheduler(0, SCHED_BATCH, &p);  // this thread only (Linux); a refusal keeps SCHED_OTHER
    }
  }

 private:
  int fd_;     // the ticker
  int hello_;  // the first wake
  bool attached_ = false;
  bool greeted_ = false;  // touched on the loop's thread only
};

struct gloo::impl {
  // Declared first, gone last: the loop it is registered on (held by the
  // device, the context and the buffers below) is gone before it.
  loop_ticker ticker;
  // Buffers of failed collectives (see fail()): freed after the context and the device.
  unbound_buffers failed;
  std::string broken;  // why an earlier collective failed; empty while the communicator works
  std::optional<std::size_t> broken_lost;   // ... because this peer died
  std::optional<std::vector<std::size_t>> broken_lagging;  // ... because it timed out (these had not arrived)
  std::shared_ptr<::gloo::transport::Device> device;
  std::shared_ptr<::gloo::rendezvous::Context> context;
  // The peers' liveness (peer_watch.hpp). Goes first, saying its last word
  // before the pairs close.
  std::shared_ptr<detail::peer_watch> watch;  // shared only with liveness()'s weak references
  std::chrono::milliseconds timeout{};
  std::uint64_t exchanges = 0;  // exchange() calls so far: the same count on every rank
  std::uint64_t gathers = 0;    // direct all_gather() calls so far: the same count on every rank
  std::uint64_t calls = 0;      // collectives so far: the same count on every rank
  bool proving = false;         // in the rendezvous's pair proof (prove_pairs)

  // The members then go in reverse order: the watch (its last word), the
  // pairs (with the context), the loop's thread (with the device), the
  // failed collectives' buffers, the ticker.
  ~impl() { ticker.run(true); }  // the pairs close and the loop's thread ends within a tick each
};

namespace {
// Gloo's rendezvous over the program's kv_store (comm/store.hpp), every key
// under `prefix/`. Gloo's timeout-less wait() uses the store's timeout.
class kv_adapter final : public ::gloo::rendezvous::Store {
 public:
  kv_adapter(std::shared_ptr<kv_store> kv, std::string prefix, std::chrono::milliseconds timeout)
      : kv_(std::move(kv)), prefix_(prefix.empty() ? std::string() : prefix + "/"), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { kv_->set(prefix_ + key, data); }
  std::vector<char> get(const std::string& key) override { return kv_->get(prefix_ + key, timeout_); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void erase(const std::string& key) { kv_->erase(prefix_ + key); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    kv_->wait(full, timeout);
  }

 private:
  std::shared_ptr<kv_store> kv_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

// The rendezvous store as this rank uses it: remembers the keys it set, so
// that it can remove them once no peer needs them any more (see gloo::gloo),
// through `erase`, the backend's removal of one key.
class key_tracking_store final : public ::gloo::rendezvous::Store {
 public:
  key_tracking_store(::gloo::rendezvous::Store& base, std::function<void(const std::string&)> erase)
      : base_(base), erase_(std::move(erase)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    keys_.push_back(key);
    base_.set(key, data);
  }
  std::vector<char> get(const std::string& key) override { return base_.get(key); }
  void wait(const std::vector<std::string>& keys) override { base_.wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    base_.wait(keys, timeout);
  }
  /// Removes every key this rank set (a key already gone is no error).
  void erase_all() noexcept {
    for (const auto& k : keys_) {
      try {
        erase_(k);
      } catch (...) {  // a store that cannot remove a key leaves it: nothing else to do
      }
    }
    keys_.clear();
  }

 private:
  ::gloo::rendezvous::Store& base_;
  std::function<void(const std::string&)> erase_;
  std::vector<std::string> keys_;
};

#if defined(SLUICE_GLOO_REDIS)
// Gloo's RedisStore, with the removal of a key (its hiredis connection is
// protected in Gloo), and its PrefixStore, with the full name of a key.
struct erasable_redis_store final : ::gloo::rendezvous::RedisStore {
  using RedisStore::RedisStore;
  void erase(const std::string& key) {
    if (auto* r = static_cast<redisReply*>(::redisCommand(redis_, "DEL %b", key.data(), key.size()))) ::freeReplyObject(r);
  }
  void login(const std::string& password, const std::string& where) { detail::redis_login(redis_, password, where); }
};
struct joined_prefix_store final : ::gloo::rendezvous::PrefixStore {
  using PrefixStore::PrefixStore;
  std::string joined(const std::string& key) { return joinKey(key); }
};
#endif

// Gloo's FileStore keeps each key in a file of its directory (objectPath,
// protected in Gloo): removing the file removes the key.
struct erasable_file_store final : ::gloo::rendezvous::FileStore {
  using FileStore::FileStore;
  using FileStore::wait;
  // Gloo's own wait sleeps 10 ms between looks at the directory; a rank
  // waits on keys several times in a rendezvous (addresses, the peer watch's,
  // the meeting barrier), which on 8 ranks of one node added tens of ms to
  // every start. Written here rather than patched into Gloo: the same
  // check, looked at every millisecond, and Gloo's own kind of timeout.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!check(keys)) {
      if (std::chrono::steady_clock::now() >= deadline)
        throw ::gloo::IoException(fmt::format("Wait timeout for key(s): {}", fmt::join(keys, ", ")));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  void erase(const std::string& key) {
    std::error_code ec;
    std::filesystem::remove(objectPath(key), ec);
  }
};

#if defined(SLUICE_GLOO_REDIS)
// Whether a TCP connection to host:port succeeds within `timeout`. Checked
// before constructing Gloo's RedisStore: its constructor throws on a failed
// connect without freeing the hiredis context (a leak per attempt), and a
// blocking connect to an unreachable host would outwait our timeout.
std::string tcp_unreachable(const std::string& host, int port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (const int r = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); r != 0)
    return fmt::format("cannot resolve '{}': {}", host, ::gai_strerror(r));
  std::string why = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int err = 0;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        const int n = ::poll(&p, 1, static_cast<int>(timeout.count()));
        socklen_t len = sizeof err;
        if (n == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        if (n == 0) err = ETIMEDOUT;
      }
    }
    ::close(fd);
    if (err == 0) {
      ::freeaddrinfo(res);
      return {};
    }
    why = std::strerror(err);
  }
  ::freeaddrinfo(res);
  return why;
}
#endif

// A Gloo collective's options, with access to the unbound buffers they own
// (protected in Gloo), so that a failed collective can hand them over.
template <class Options>
struct holding : Options {
  using Options::Options;
  // The unbound buffers the collective waits on (for the peer watch).
  std::vector<::gloo::transport::UnboundBuffer*> buffers() {
    std::vector<::gloo::transport::UnboundBuffer*> v;
    if constexpr (std::is_same_v<Options, ::gloo::BarrierOptions>) {
      if (this->buffer) v.push_back(this->buffer.get());
    } else {
      if (this->in) v.push_back(this->in.get());
      if (this->out) v.push_back(this->out.get());
    }
    return v;
  }
  void hand_over(unbound_buffers& to) {
    if constexpr (std::is_same_v<Options, ::gloo::BarrierOptions>) {
      to.push_back(std::move(this->buffer));
    } else {
      to.push_back(std::move(this->in));
      to.push_back(std::move(this->out));
    }
  }
};

// Gloo reports a dead peer, a timeout or a misuse as an exception of its own
// (gloo::IoException, gloo::EnforceNotMet, ...): one sluice error for all.
template <class F>
void translated(const char* what, std::size_t rank, F&& f) {
  try {
    f();
  } catch (const comm_error&) {
    throw;
  } catch (const config_error&) {  // the caller's set-up (a store directory others can read): its own type
    throw;
  } catch (const std::exception& e) {
    throw comm_error(fmt::format("gloo {} failed on rank {}: {}", what, rank, e.what()));
  }
}

// Whether a Gloo error is its application-side timeout.
bool is_timeout(std::string_view why) {
  return why.find("Timed out") != std::string_view::npos || why.find("timeout") != std::string_view::npos;
}

// Runs a collective (its errors as translated() makes them). A failure
// breaks the communicator: every pair is closed at once (a peer still up can
// no longer write into the caller's buffers after we return), and the
// collective's unbound buffers are kept until the communicator goes — Gloo's
// device thread may still be signalling them, and freeing them then races it
// (TSan, killed-rank test: a buffer's mutex destroyed while the device thread
// held it). Later calls throw at once, the same kind of error.
//
// The failure's cause comes from the peer watch: a dead peer (directly, or
// by a survivor's last word) makes it comm::peer_lost; a Gloo timeout, or a
// survivor's last word "timeout", comm::comm_timeout naming the peers that
// had not started this collective. Before its pairs close, this rank says
// its own last word, so the peers that see them close know why.
// `f(arm)`: runs the collective, calling arm(buffers) once its unbound
// buffers exist and before it waits on them. `hand_over(to)` moves the
// collective's unbound buffers into `to`. (Impl is gloo::impl, deduced: a
// private type.)
template <class Impl, class F, class HandOver>
void guarded(Impl& m, std::size_t rank, const char* what, F&& f, HandOver&& hand_over) {
  if (!m.broken.empty()) {
    const auto again = fmt::format("gloo {} on rank {}: the communicator failed earlier ({})", what, rank, m.broken);
    if (m.broken_lost) throw peer_lost(*m.broken_lost, again);
    if (m.broken_lagging) throw comm_timeout(*m.broken_lagging, again);
    throw comm_error(again);
  }
  const auto seq = ++m.calls;
  bool armed = false;
  auto arm = [&](std::span<::gloo::transport::UnboundBuffer* const> buffers) {
    if (!m.watch) return;
    if (!armed) m.watch->arm(seq, buffers);
    else m.watch->arm_more(buffers);
    armed = true;
  };
  std::string why;
  bool failed = true;
  std::optional<std::size_t> lost;
  try {
    f(arm);
    failed = false;
  } catch (const peer_lost& e) {
    why = fmt::format("gloo {} on rank {}: {}", what, rank, e.reason());
    lost = e.lost_rank();
  } catch (const comm_error& e) {
    why = e.what();
  } catch (const std::exception& e) {
    why = fmt::format("gloo {} failed on rank {}: {}", what, rank, e.what());
  }
  if (!m.watch) {
    if (!failed) return;
  }
  std::optional<std::vector<std::size_t>> lagging;
  if (m.watch) {
    auto v = m.watch->disarm();
    // Gloo may see a closed socket before the watch does: give it a moment
    // to tell a death (or a peer's last word) from anything else. A timeout
    // of this rank's own needs no wait.
    const bool own_timeout = failed && is_timeout(why);
    if (failed && !lost && !v.lost && !own_timeout) v = m.watch->settle(std::chrono::milliseconds(2000));
    if (!lost && v.lost) {
      // The collective's waits were interrupted (or it failed because of
      // the death): whatever it returned is void.
      lost = v.lost;
      why = failed ? fmt::format("gloo {} on rank {}: {} (Gloo: {})", what, rank, v.how, why)
                   : fmt::format("gloo {} on rank {}: {}", what, rank, v.how);
    } else if (!lost && failed && (own_timeout || v.timeout)) {
      lagging = v.lagging;
    }
    if (!failed && !lost) return;
    m.watch->last_word(lost ? detail::peer_watch::lost_word(*lost) : lagging ? "timeout" : "failed");
  }
  m.broken = why;
  m.broken_lost = lost;
  m.broken_lagging = lagging;
  try {
    if (m.context) m.context->closeConnections();
  } catch (...) {  // closing what already failed: nothing more to do
  }
  unbound_buffers held;
  hand_over(held);
  for (auto& b : held)
    if (b) m.failed.push_back(std::move(b));
  if (lost) throw peer_lost(*lost, why);
  if (lagging) throw comm_timeout(*lagging, why);
  throw comm_error(why);
}
// Gloo's TCP transport writes to its peers with plain writev: once a peer has
// died, the next write raises SIGPIPE, whose default action kills this rank
// on the spot instead of letting the collective fail with comm_error (seen:
// a survivor of the killed-rank test exited by signal 13). Each communicator
// made ignores the signal for the process while its disposition is the
// default (checked every time, not once: a forked child or a process that
// reset it to the default is covered as well); a process's own handler is
// kept. A write to a dead peer then fails with EPIPE, which Gloo reports.
void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL && !(current.sa_flags & SA_SIGINFO)) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, nullptr);
  }
}
}  // namespace

gloo::gloo(std::size_t rank, std::size_t size, const gloo_options& opt)
    : impl_(std::make_unique<impl>()), rank_(rank), size_(size) {
  if (size == 0 || rank >= size) throw config_error(fmt::format("gloo: rank {} of a world of {}", rank, size));
  ignore_sigpipe_unless_handled();
  const bool redis = opt.store.redis();
  if (opt.store.empty())
    throw config_error("gloo: no rendezvous (set SLUICE_STORE_DIR or SLUICE_STORE=redis://HOST:PORT/PREFIX, or pass a kv_store)");
#if !defined(SLUICE_GLOO_REDIS)
  if (redis)
    throw config_error(fmt::format("gloo: a Redis store ({}:{}) needs sluice built with hiredis's headers (libhiredis-dev)",
                                   opt.store.redis_host, opt.store.redis_port));
#endif
  impl_->timeout = opt.timeout;
  // Meets the others through `base`. Once every rank is connected (the
  // barrier: each has read every key it needed) no key is needed any more, and
  // this rank removes the keys it set, through `erase`; it does so after a
  // failure too (a world that did not form needs none): a store keeps nothing
  // of a world, and a directory or prefix can serve the next one.
  auto meet = [&](std::shared_ptr<::gloo::rendezvous::Context> ctx, ::gloo::rendezvous::Store& base,
                  std::function<void(const std::string&)> erase) {
    key_tracking_store store(base, std::move(erase));
    try {
      // The load's secret: drawn by rank 0, carried by the store (set before
      // Gloo's keys, so it is there once the mesh is up), never printed.
      std::optional<load_secret> secret;
      if (rank == 0) {
        secret = load_secret::draw();
        const auto b = secret->bytes();
        store.set("sluice-secret", std::vector<char>(reinterpret_cast<const char*>(b.data()),
                                                     reinterpret_cast<const char*>(b.data()) + b.size()));
      }
      // The peer watch meets through the same store: its address is set
      // before Gloo's keys, so every peer's is there once the mesh is up.
      auto watch = std::make_unique<detail::peer_watch>(rank, size, opt.hostname);
      const auto& a = watch->address();
      store.set(fmt::format("sluice-watch-{}", rank), std::vector<char>(a.begin(), a.end()));
      impl_->ticker.run(true);  // each pair's connecting side waits for the loop (loop_ticker)
      ctx->connectFullMesh(store, impl_->device);
      impl_->ticker.run(false);
      if (!secret) {
        const auto v = store.get("sluice-secret");
        secret = load_secret::from(std::as_bytes(std::span(v)));
      }
      std::vector<std::string> addresses(size);
      for (std::size_t p = 0; p < rank; ++p) {
        const auto v = store.get(fmt::format("sluice-watch-{}", p));
        addresses[p].assign(v.begin(), v.end());
      }
      // The pairs prove the secret first (a stranger on a pair is named
      // here, by every rank), then the watch's connections do.
      impl_->context = std::move(ctx);
      prove_pairs(*secret);
      auto warn = opt.warn ? opt.warn : [](const std::string& m) { std::fprintf(stderr, "sluice: %s\n", m.c_str()); };
      watch->connect(addresses, opt.timeout, *secret, warn);
      impl_->watch = std::move(watch);
      barrier();
    } catch (...) {
      store.erase_all();
      throw;
    }
    store.erase_all();
  };
  translated("rendezvous", rank, [&] {
    ::gloo::transport::tcp::attr attr;
    attr.hostname = opt.hostname;
    impl_->device = ::gloo::transport::tcp::CreateDevice(attr);
    impl_->ticker.attach(*impl_->device);
    auto ctx = std::make_shared<::gloo::rendezvous::Context>(static_cast<int>(rank), static_cast<int>(size));
    ctx->setTimeout(opt.timeout);
    if (opt.store.kv) {
      kv_adapter store(opt.store.kv, opt.store.prefix, opt.timeout);
      meet(std::move(ctx), store, [&store](const std::string& k) { store.erase(k); });
      return;
    }
#if defined(SLUICE_GLOO_REDIS)
    if (redis) {
      if (auto why = tcp_unreachable(opt.store.redis_host, opt.store.redis_port, opt.timeout); !why.empty())
        throw comm_error(fmt::format("gloo rendezvous failed on rank {}: cannot reach the Redis store at {}:{}: {}", rank,
                                     opt.store.redis_host, opt.store.redis_port, why));
      auto base = std::make_unique<erasable_redis_store>(opt.store.redis_host, opt.store.redis_port);
      base->login(opt.store.password, fmt::format("redis://{}:{}", opt.store.redis_host, opt.store.redis_port));
      joined_prefix_store store(opt.store.prefix, *base);
      meet(std::move(ctx), store, [&](const std::string& k) { base->erase(store.joined(k)); });
      return;
    }
#endif
    // A prefix on a file store is a subdirectory (Gloo's FileStore makes no
    // directories for the '/' that PrefixStore would put in its keys).
    // Only a directory of this user's own, closed to others: the load's
    // secret passes through it (check_private_dir).
    std::string dir = opt.store.dir;
    check_private_dir(dir);
    if (!opt.store.prefix.empty()) {
      dir = (std::filesystem::path(dir) / opt.store.prefix).string();
      try {
        make_private_dir(dir);
      } catch (const std::exception& e) {
        throw comm_error(fmt::format("gloo rendezvous failed on rank {}: {}", rank, e.what()));
      }
      check_private_dir(dir);
    }
    erasable_file_store store(dir);
    meet(std::move(ctx), store, [&store](const std::string& k) { store.erase(k); });
  });
}

// Gloo's pairs take the first connection to their listener as the peer
// (Debian's Gloo has no handshake hook and no TLS transport): before any byte
// of the load, each pair proves the load's secret both ways, over fresh
// nonces, so a stranger who got a pair fails the rendezvous here, named.
void gloo::prove_pairs(const load_secret& secret) {
  if (size_ == 1) return;
  impl_->proving = true;
  struct done_proving {
    impl* m;
    ~done_proving() { m->proving = false; }
  } reset{impl_.get()};
  std::vector<load_secret::nonce_t> mine(size_), theirs(size_);
  std::vector<load_secret::proof_t> proofs(size_), answers(size_);
  std::vector<send_message> sends;
  std::vector<recv_message> recvs;
  for (std::size_t p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    mine[p] = load_secret::nonce();
    sends.push_back({p, 0, std::as_bytes(std::span(mine[p]))});
    recvs.push_back({p, 0, std::as_writable_bytes(std::span(theirs[p]))});
  }
  exchange(sends, recvs);
  sends.clear(), recvs.clear();
  for (std::size_t p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    proofs[p] = secret.prove("sluice-gloo-pair", rank_, p, mine[p], theirs[p]);
    sends.push_back({p, 1, std::as_bytes(std::span(proofs[p]))});
    recvs.push_back({p, 1, std::as_writable_bytes(std::span(answers[p]))});
  }
  exchange(sends, recvs);
  std::vector<std::size_t> failed;
  for (std::size_t p = 0; p < size_; ++p)
    if (p != rank_ && !secret.check(answers[p], "sluice-gloo-pair", p, rank_, theirs[p], mine[p])) failed.push_back(p);
  if (!failed.empty())
    throw comm_error(fmt::format("gloo rendezvous on rank {}: the Gloo pair with rank {} did not prove the load's secret: "
                                 "whoever connected as that rank is not of this load (or its store gave it another secret)",
                                 rank_, fmt::join(failed, ", rank ")));
}

std::optional<gloo> gloo::group(const rank_info& who, std::span<const std::size_t> members, std::string_view name) {
  if (name.empty() || name.find('/') != std::string_view::npos)
    throw config_error(fmt::format("gloo group: name '{}' must be non-empty and without '/'", name));
  std::optional<std::size_t> index;
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (members[i] >= who.world_size)
      throw config_error(fmt::format("gloo group '{}': rank {} is not in the world of {}", name, members[i], who.world_size));
    for (std::size_t j = 0; j < i; ++j)
      if (members[j] == members[i]) throw config_error(fmt::format("gloo group '{}': rank {} is listed twice", name, members[i]));
    if (members[i] == who.rank) index = i;
  }
  if (!index) return std::nullopt;
  auto o = gloo_options::from(who);
  o.store.prefix = o.store.prefix.empty() ? fmt::format("group-{}", name) : fmt::format("{}/group-{}", o.store.prefix, name);
  return gloo(*index, members.size(), o);
}

gloo::gloo(const rank_info& who)
    : gloo(who.rank, who.world_size, gloo_options::from(who)) {}

gloo::gloo(gloo&&) noexcept = default;
gloo& gloo::operator=(gloo&&) noexcept = default;
gloo::~gloo() = default;

void gloo::broadcast(std::span<std::byte> buf, std::size_t root) {
  if (root >= size_) throw config_error(fmt::format("gloo broadcast: root {} of a world of {}", root, size_));
  if (size_ == 1 || buf.empty()) return;
  holding<::gloo::BroadcastOptions> o(impl_->context);
  guarded(
      *impl_, rank_, "broadcast",
      [&](auto& arm) {
        o.setOutput(reinterpret_cast<std::uint8_t*>(buf.data()), buf.size());
        o.setRoot(static_cast<int>(root));
        o.setTimeout(impl_->timeout);
        arm(o.buffers());
        ::gloo::broadcast(o);
      },
      [&](unbound_buffers& to) { o.hand_over(to); });
}

namespace {

// Posts `recvs` and `sends` (skipping empty ones) as Gloo unbound buffers
// (kept in `rx` and `tx`), each under the slot `prefix` | `seq` | its tag (a
// prefix byte that Gloo's own collectives do not use), and waits for all of
// them, within `timeout`. The test fault `fault` (a phase name, or null)
// lands once they are in flight.
template <class Arm>
void post_and_wait(::gloo::Context& ctx, Arm& arm, std::size_t rank, const char* what, std::uint64_t prefix, std::uint64_t seq,
                   std::span<const send_message> sends, std::span<const recv_message> recvs, std::chrono::milliseconds timeout,
                   const char* fault, unbound_buffers& rx, unbound_buffers& tx) {
  auto slot = [&](std::uint32_t tag) { return (prefix << 56) | ((seq & 0xffffffu) << 32) | tag; };
  rx.reserve(recvs.size()), tx.reserve(sends.size());
  for (const auto& m : recvs) {
    if (m.bytes.empty()) continue;
    rx.push_back(ctx.createUnboundBuffer(m.bytes.data(), m.bytes.size()));
    rx.back()->recv(static_cast<int>(m.peer), slot(m.tag), 0, m.bytes.size());
  }
  for (const auto& m : sends) {
    if (m.bytes.empty()) continue;
    // Gloo's buffer type is not const-correct; a send only reads it.
    tx.push_back(ctx.createUnboundBuffer(const_cast<std::byte*>(m.bytes.data()), m.bytes.size()));
    tx.back()->send(static_cast<int>(m.peer), slot(m.tag), 0, m.bytes.size());
  }
  std::vector<::gloo::transport::UnboundBuffer*> waited;
  for (auto* v : {&rx, &tx})
    for (auto& b : *v) waited.push_back(b.get());
  arm(waited);
  if (fault) ::sluice::detail::fault_point(fault, rank);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
  };
  // A wait that returns false was interrupted by the peer watch (a lost
  // peer: guarded() says which).
  for (auto& b : rx)
    if (!b->waitRecv(left())) throw comm_error(fmt::format("gloo {}: a receive on rank {} was interrupted", what, rank));
  for (auto& b : tx)
    if (!b->waitSend(left())) throw comm_error(fmt::format("gloo {}: a send on rank {} was interrupted", what, rank));
}

// The all-gathers whose parts are at most this size go directly from every
// rank to every other (gloo::all_gather); larger ones take Gloo's ring.
constexpr std::size_t direct_gather_max = std::size_t{64} << 10;

// One point-to-point round as a collective (post_and_wait under guarded(),
// which keeps its buffers if it fails). (Impl is gloo::impl, deduced.)
template <class Impl>
void transfer(Impl& m, std::size_t rank, const char* what, std::uint64_t prefix, std::uint64_t seq,
              std::span<const send_message> sends, std::span<const recv_message> recvs, const char* fault) {
  unbound_buffers rx, tx;
  guarded(
      m, rank, what,
      [&](auto& arm) { post_and_wait(*m.context, arm, rank, what, prefix, seq, sends, recvs, m.timeout, fault, rx, tx); },
      [&](unbound_buffers& to) {
        for (auto* v : {&rx, &tx})
          for (auto& b : *v) to.push_back(std::move(b));
      });
}

}  // namespace

void gloo::all_gather(std::span<const std::byte> in, std::span<std::byte> out) {
  if (out.size() != in.size() * size_)
    throw config_error(fmt::format("gloo all_gather: output of {} bytes for {} ranks x {}", out.size(), size_, in.size()));
  if (size_ == 1) {
    if (!in.empty() && in.data() != out.data()) std::memmove(out.data(), in.data(), in.size());
    return;
  }
  if (in.empty()) return barrier();
  if (in.size() <= direct_gather_max) {
    // Every rank sends its part to every other at once. Gloo's all-gather is
    // a ring: size - 1 steps, each waiting for the previous one's rank to
    // run, which for the failure protocol's small status records made every
    // meeting of 8 ranks on 2 cores cost 5-14 ms (bench/HISTORY.md). Each
    // rank sends and receives the same bytes either way.
    if (in.data() != out.data() + rank_ * in.size()) std::memmove(out.data() + rank_ * in.size(), in.data(), in.size());
    std::vector<send_message> sends;
    std::vector<recv_message> recvs;
    for (std::size_t r = 0; r < size_; ++r)
      if (r != rank_) {
        sends.push_back({r, 0, in});
        recvs.push_back({r, 0, out.subspan(r * in.size(), in.size())});
      }
    return transfer(*impl_, rank_, "all_gather", 0xa6, impl_->gathers++, sends, recvs, nullptr);
  }
  holding<::gloo::AllgatherOptions> o(impl_->context);
  guarded(
      *impl_, rank_, "all_gather",
      [&](auto& arm) {
        o.setInput(const_cast<std::uint8_t*>(reinterpret_cast<const std::uint8_t*>(in.data())), in.size());
        o.setOutput(reinterpret_cast<std::uint8_t*>(out.data()), out.size());
        o.setTimeout(impl_->timeout);
        arm(o.buffers());
        ::gloo::allgather(o);
      },
      [&](unbound_buffers& to) { o.hand_over(to); });
}

void gloo::all_gather_v(std::span<std::byte> buf, std::span<const std::size_t> counts) {
  if (counts.size() != size_) throw config_error(fmt::format("gloo all_gather_v: {} counts for {} ranks", counts.size(), size_));
  std::size_t total = 0;
  for (auto c : counts) total += c;
  if (total != buf.size()) throw config_error(fmt::format("gloo all_gather_v: counts sum to {}, buffer has {}", total, buf.size()));
  if (size_ == 1 || total == 0) return;
  holding<::gloo::AllgathervOptions> o(impl_->context);
  guarded(
      *impl_, rank_, "all_gather_v",
      [&](auto& arm) {
        // No input: this rank's part is already in place in the output.
        o.setOutput(reinterpret_cast<std::uint8_t*>(buf.data()), std::vector<std::size_t>(counts.begin(), counts.end()));
        o.setTimeout(impl_->timeout);
        arm(o.buffers());
        ::gloo::allgatherv(o);
      },
      [&](unbound_buffers& to) { o.hand_over(to); });
}

void gloo::exchange(std::span<const send_message> sends, std::span<const recv_message> recvs) {
  auto check = [this](std::size_t peer, const char* what) {
    if (peer >= size_ || peer == rank_)
      throw config_error(fmt::format("gloo exchange: rank {} cannot {} rank {} (world of {})", rank_, what, peer, size_));
  };
  for (const auto& m : sends) check(m.peer, "send to");
  for (const auto& m : recvs) check(m.peer, "receive from");
  // A slot per message: this exchange's sequence number and the message's
  // tag. The test fault of phase "exchange" lands with messages in flight
  // (a load's, not the rendezvous's pair proof).
  transfer(*impl_, rank_, "exchange", 0xa5, impl_->exchanges++, sends, recvs, impl_->proving ? nullptr : "exchange");
}

std::function<void()> gloo::liveness() const {
  return [w = std::weak_ptr<detail::peer_watch>(impl_->watch)] {
    if (const auto watch = w.lock()) watch->check();
  };
}

void gloo::barrier() {
  if (size_ == 1) return;
  std::optional<holding<::gloo::BarrierOptions>> o;
  guarded(
      *impl_, rank_, "barrier",
      [&](auto& arm) {
        o.emplace(impl_->context);
        o->setTimeout(impl_->timeout);
        arm(o->buffers());
        ::gloo::barrier(*o);
      },
      [&](unbound_buffers& to) {
        if (o) o->hand_over(to);
      });
}

}  // namespace sluice::inline v0::comm
