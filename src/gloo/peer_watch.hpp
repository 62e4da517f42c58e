#pragma once
// peer_watch: how a rank of comm::gloo learns, within moments, that a peer
// died, and why a peer left. Private to src/gloo (see docs/design.md, "Dead
// peers").
//
// Beside Gloo's pairs, every two ranks hold one more TCP connection that
// carries only short lines about the sender: "at N" when it starts its N-th
// collective, and one last word before it closes: "lost R" (it failed because
// rank R died), "timeout", "failed" or "done". One thread per communicator
// polls these connections. A connection that ends without a last word is a
// dead peer: the kernel closes a killed process's sockets, whatever it was
// doing, and a stopped process keeps them open (so a stopped peer is never
// taken for dead; the communicator's timeout covers it). A last word "lost R"
// tells the others that R died, so a rank that learns of it only through a
// survivor's closed pairs still names R.
//
// Why not Gloo's own pairs: Gloo's TCP pair signals a peer's closed socket to
// the operations still queued on it, but not to an unbound-buffer receive whose
// bytes had begun to arrive, nor to a send being written (tcp/pair.cc,
// signalException): such a wait runs into the full timeout. And a pair closed
// by a survivor that failed looks the same as a pair closed by a death.
//
// When a peer is lost, the watch interrupts the waits on the unbound buffers
// that the current collective armed (Gloo's public abortWaitRecv/Send, again
// every few milliseconds while the collective runs: a Gloo algorithm goes on
// to its next wait after an interrupted one), and the collective's caller
// throws comm::peer_lost whatever the algorithm returned; a collective that
// arms after the loss throws at once.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <gloo/transport/unbound_buffer.h>

#include "../core/socket_io.hpp"
#include "../core/thread_name.hpp"

#include <sluice/comm/secret.hpp>
#include <sluice/error.hpp>

namespace sluice::inline v0::comm::detail {

class peer_watch {
 public:
  using clock = std::chrono::steady_clock;
  /// What the watch knows of a failure's cause.
  struct verdict {
    std::optional<std::size_t> lost;  ///< a peer that died
    std::string how;                  ///< how it is known
    bool timeout = false;             ///< a peer's last word was "timeout"
    std::vector<std::size_t> lagging; ///< peers that had not started collective `seq`
  };

  /// Listens on `host`, any port.
  peer_watch(std::size_t rank, std::size_t size, const std::string& host)
      : rank_(rank), fds_(size, -1), words_(size), at_(size, 0), ended_(size, false) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* res = nullptr;
    if (const int r = ::getaddrinfo(host.c_str(), "0", &hints, &res); r != 0)
      throw comm_error(fmt::format("gloo peer watch on rank {}: cannot resolve '{}': {}", rank, host, ::gai_strerror(r)));
    for (addrinfo* a = res; a && listen_ < 0; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
        listen_ = fd;
        break;
      }
      ::close(fd);
    }
    ::freeaddrinfo(res);
    if (listen_ < 0) throw comm_error(fmt::format("gloo peer watch on rank {}: cannot listen on {}: {}", rank, host, std::strerror(errno)));
    sockaddr_storage sa{};
    socklen_t len = sizeof sa;
    ::getsockname(listen_, reinterpret_cast<sockaddr*>(&sa), &len);
    const auto port = sa.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port)
                                               : ntohs(reinterpret_cast<sockaddr_in*>(&sa)->sin_port);
    address_ = fmt::format("{}|{}", host, port);
    wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_ < 0) {
      ::close(listen_);
      throw comm_error(fmt::format("gloo peer watch on rank {}: eventfd: {}", rank, std::strerror(errno)));
    }
  }
  peer_watch(const peer_watch&) = delete;
  peer_watch& operator=(const peer_watch&) = delete;

  /// Says its last word (unless one was said), stops the thread, closes.
  /// The word is lost_word(R) where this rank knows that peer R died without
  /// having failed a collective over it (check() threw, outside any
  /// collective), else "done". A peer still in a collective with this rank
  /// sees its pairs close next; told "done", it would take that for a
  /// failure of no known cause (comm_error, not peer_lost: seen on a busy
  /// machine, a survivor of the killed-rank test).
  ~peer_watch() {
    std::string word = "done";
    {
      std::lock_guard lock(m_);
      if (lost_) word = lost_word(*lost_);
    }
    last_word(word);
    if (thread_.joinable()) {
      const std::uint64_t one = 1;
      (void)!::write(wake_, &one, sizeof one);
      thread_.join();
    }
    for (int& fd : fds_)
      if (fd >= 0) ::close(fd);
    if (listen_ >= 0) ::close(listen_);
    ::close(wake_);
  }

  /// "host|port": what the peers connect to.
  [[nodiscard]] const std::string& address() const noexcept { return address_; }

  /// Connects to every peer (`addresses[r]` is rank r's address), then
  /// starts the thread. Lower ranks are connected to, higher ones accepted
  /// (their connections wait in the listen backlog: no rank waits for
  /// another's order). Each connection proves the load's secret both ways
  /// before it counts (a greeting with the connector's rank and nonce; the
  /// acceptor's nonce and proof; the connector's proof): a connection to this
  /// rank that does not (a stranger on the port, a rank of another load) is
  /// refused, closed and reported through `warn` (the first one; refused()
  /// counts them), and the watch goes on waiting for its peers; a peer this
  /// rank connects to that does not prove it fails the rendezvous. Throws
  /// comm_error after `timeout`.
  void connect(const std::vector<std::string>& addresses, std::chrono::milliseconds timeout, const load_secret& secret,
               const std::function<void(const std::string&)>& warn) {
    const auto deadline = clock::now() + timeout;
    auto left_ms = [&](clock::time_point until) {
      return static_cast<int>(std::max<long long>(
          1, std::chrono::duration_cast<std::chrono::milliseconds>(std::min(until, deadline) - clock::now()).count()));
    };
    auto fail = [&](const std::string& what) -> void {
      throw comm_error(fmt::format("gloo peer watch on rank {}: {}", rank_, what));
    };
    for (std::size_t p = 0; p < rank_; ++p) {
      const auto& a = addresses[p];
      const auto bar = a.rfind('|');
      if (bar == std::string::npos) fail(fmt::format("rank {}'s address '{}' is malformed", p, a));
      addrinfo hints{};
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* res = nullptr;
      if (const int r = ::getaddrinfo(a.substr(0, bar).c_str(), a.substr(bar + 1).c_str(), &hints, &res); r != 0)
        fail(fmt::format("cannot resolve rank {}'s address '{}': {}", p, a, ::gai_strerror(r)));
      int fd = -1;
      std::string why = "no address";
      for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) continue;
        int err = 0;
        if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
          err = errno;
          if (err == EINPROGRESS) {
            pollfd pf{fd, POLLOUT, 0};
            const int n = ::poll(&pf, 1, left_ms(deadline));
            socklen_t len = sizeof err;
            if (n == 1) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
            else err = ETIMEDOUT;
          }
        }
        if (err != 0) {
          why = std::strerror(err);
          ::close(fd);
          fd = -1;
        }
      }
      ::freeaddrinfo(res);
      if (fd < 0) fail(fmt::format("cannot connect to rank {} at {}: {}", p, a, why));
      fds_[p] = fd;
      greeting g{rank_, load_secret::nonce()};
      answer ans{};
      if (!::sluice::detail::send_all(fd, &g, sizeof g, deadline) || !::sluice::detail::recv_all(fd, &ans, sizeof ans, deadline))
        fail(fmt::format("rank {} at {} did not answer its greeting: {}", p, a, errno ? std::strerror(errno) : "closed"));
      if (!secret.check(ans.proof, "sluice-watch", p, rank_, ans.nonce, g.nonce))
        fail(fmt::format("whoever listens at rank {}'s address {} did not prove the load's secret", p, a));
      const auto mine = secret.prove("sluice-watch", rank_, p, g.nonce, ans.nonce);
      if (!::sluice::detail::send_all(fd, mine.data(), mine.size(), deadline)) fail(fmt::format("cannot answer rank {}: {}", p, std::strerror(errno)));
    }
    for (std::size_t n = rank_ + 1; n < fds_.size();) {
      pollfd pf{listen_, POLLIN, 0};
      if (::poll(&pf, 1, left_ms(deadline)) != 1) {
        std::vector<std::size_t> missing;
        for (std::size_t q = rank_ + 1; q < fds_.size(); ++q)
          if (fds_[q] < 0) missing.push_back(q);
        fail(fmt::format("timed out waiting for rank {} to connect{}", fmt::join(missing, ", "),
                         refused_ ? fmt::format(" ({} connection(s) refused: they did not prove the load's secret)", refused_)
                                  : std::string()));
      }
      sockaddr_storage from{};
      socklen_t from_len = sizeof from;
      const int fd = ::accept4(listen_, reinterpret_cast<sockaddr*>(&from), &from_len, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) fail(fmt::format("accept: {}", std::strerror(errno)));
      // A stranger that connects and stays silent holds the others back at
      // most this long before it is refused.
      const auto until = clock::now() + std::chrono::seconds(5);
      greeting g{};
      std::string refused;
      if (!::sluice::detail::recv_all(fd, &g, sizeof g, until)) {
        refused = "no greeting";
      } else if (g.rank <= rank_ || g.rank >= fds_.size() || fds_[g.rank] >= 0) {
        refused = fmt::format("a greeting as rank {}, which is not a peer still expected", g.rank);
      } else {
        answer ans{load_secret::nonce(), {}};
        ans.proof = secret.prove("sluice-watch", rank_, g.rank, ans.nonce, g.nonce);
        load_secret::proof_t theirs{};
        if (!::sluice::detail::send_all(fd, &ans, sizeof ans, until) || !::sluice::detail::recv_all(fd, theirs.data(), theirs.size(), until))
          refused = fmt::format("a greeting as rank {}, then no proof", g.rank);
        else if (!secret.check(theirs, "sluice-watch", g.rank, rank_, g.nonce, ans.nonce))
          refused = fmt::format("a greeting as rank {} with a wrong proof", g.rank);
      }
      if (!refused.empty()) {
        ::close(fd);
        if (refused_++ == 0 && warn)
          warn(fmt::format("gloo peer watch on rank {}: refused a connection from {} that did not prove the load's secret "
                           "({}); still waiting for its peers",
                           rank_, peer_name(from), refused));
        continue;
      }
      fds_[g.rank] = fd;
      ++n;
    }
    ::close(listen_);
    listen_ = -1;
    thread_ = ::sluice::detail::named_thread("sluice-watch", [this] { run(); });
  }

  /// Connections refused for not proving the load's secret.
  [[nodiscard]] std::size_t refused() const noexcept { return refused_; }

  /// Tells the peers this rank starts its `seq`-th collective; fails the
  /// collective at once (throws peer_lost) if a peer is known lost, else
  /// arms `buffers`: failed if a peer is lost before disarm().
  void arm(std::uint64_t seq, std::span<::gloo::transport::UnboundBuffer* const> buffers) {
    std::lock_guard lock(m_);
    seq_ = seq;
    say(fmt::format("at {}\n", seq));
    if (lost_) throw peer_lost(*lost_, how_);
    armed_.assign(buffers.begin(), buffers.end());
  }
  /// Adds buffers to the armed ones (a collective that makes them as it goes).
  void arm_more(std::span<::gloo::transport::UnboundBuffer* const> buffers) {
    std::lock_guard lock(m_);
    armed_.insert(armed_.end(), buffers.begin(), buffers.end());
    if (lost_) interrupt();
  }
  /// Throws peer_lost if a peer is known dead.
  void check() {
    std::lock_guard lock(m_);
    if (lost_) throw peer_lost(*lost_, how_);
  }
  /// Ends the collective's watch: returns what is known now (a lost peer
  /// means its waits may have been interrupted: its result is void).
  [[nodiscard]] verdict disarm() noexcept {
    std::lock_guard lock(m_);
    armed_.clear();
    return known();
  }

  /// Waits up to `within` for the cause of a failure to be known (a lost
  /// peer, or a peer's last word), and returns what is known then.
  [[nodiscard]] verdict settle(std::chrono::milliseconds within) {
    std::unique_lock lock(m_);
    cv_.wait_for(lock, within, [&] { return lost_.has_value() || told_; });
    return known();
  }

  /// The last word of a rank that knows peer `r` died (heard() reads it back).
  [[nodiscard]] static std::string lost_word(std::size_t r) { return fmt::format("lost {}", r); }

  /// This rank's last word, said once, before its pairs close: "lost R",
  /// "timeout", "failed" or "done".
  void last_word(std::string_view word) noexcept {
    std::lock_guard lock(m_);
    if (said_) return;
    said_ = true;
    say(fmt::format("{}\n", word));
    // A FIN after the word, not a reset that could drop it: the peers read
    // the word before they see the end.
    for (int fd : fds_)
      if (fd >= 0) ::shutdown(fd, SHUT_WR);
  }

 private:
  // Writes `line` to every peer still connected (never blocks: a line is a
  // few bytes into an almost empty socket buffer). Called with m_ held.
  void say(const std::string& line) noexcept {
    if (said_ && line.rfind("at ", 0) == 0) return;
    for (std::size_t p = 0; p < fds_.size(); ++p)
      if (fds_[p] >= 0 && !ended_[p]) (void)::send(fds_[p], line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  // Called with m_ held.
  verdict known() const {
    verdict v;
    if (lost_) v.lost = *lost_, v.how = how_;
    v.timeout = timeout_word_;
    for (std::size_t p = 0; p < at_.size(); ++p)
      if (p != rank_ && at_[p] < seq_) v.lagging.push_back(p);
    return v;
  }

  // Interrupts every wait on the armed buffers (each abort ends one wait:
  // the thread repeats it while they stay armed). Called with m_ held.
  void interrupt() noexcept {
    for (auto* b : armed_) {
      b->abortWaitRecv();
      b->abortWaitSend();
    }
  }

  // The thread: reads the peers' lines until each connection ends.
  void run() {
    std::vector<pollfd> pf;
    std::vector<std::size_t> who;
    std::vector<std::string> partial(fds_.size());
    for (;;) {
      pf.clear(), who.clear();
      pf.push_back({wake_, POLLIN, 0});
      who.push_back(rank_);
      {
        std::lock_guard lock(m_);
        for (std::size_t p = 0; p < fds_.size(); ++p)
          if (fds_[p] >= 0 && !ended_[p]) pf.push_back({fds_[p], POLLIN, 0}), who.push_back(p);
      }
      int wait_ms = -1;
      {
        std::lock_guard lock(m_);
        if (lost_ && !armed_.empty()) {
          interrupt();
          wait_ms = 5;
        }
      }
      if (::poll(pf.data(), pf.size(), wait_ms) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (pf[0].revents) return;
      for (std::size_t i = 1; i < pf.size(); ++i) {
        if (!pf[i].revents) continue;
        const auto p = who[i];
        char buf[512];
        const auto n = ::recv(pf[i].fd, buf, sizeof buf, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n > 0) {
          partial[p].append(buf, static_cast<std::size_t>(n));
          for (auto nl = partial[p].find('\n'); nl != std::string::npos; nl = partial[p].find('\n')) {
            heard(p, partial[p].substr(0, nl));
            partial[p].erase(0, nl + 1);
          }
          // Lines are a few words ("at 12", "lost 3", "done"): a peer that
          // sends more without a newline breaks the protocol, and its bytes
          // are not kept without bound.
          if (partial[p].size() > max_line) {
            partial[p].clear();
            broke_protocol(p, fmt::format("it sent more than {} bytes without a newline", max_line));
          }
          continue;
        }
        ended(p, n < 0 ? fmt::format("connection failed: {}", std::strerror(errno)) : std::string("connection closed"));
      }
    }
  }

  void heard(std::size_t p, const std::string& line) {
    std::lock_guard lock(m_);
    if (line.rfind("at ", 0) == 0) {
      at_[p] = std::strtoull(line.c_str() + 3, nullptr, 10);
      return;
    }
    words_[p] = line;
    told_ = true;
    if (line.rfind("lost ", 0) == 0) {
      const auto r = std::strtoull(line.c_str() + 5, nullptr, 10);
      if (r < fds_.size() && r != rank_)
        lose(r, fmt::format("its connections closed; rank {} saw it first", p));
    } else if (line == "timeout") {
      timeout_word_ = true;
    }
    cv_.notify_all();
  }

  // Peer p's watch connection carries what is not a line: its watch is
  // ignored from then on (it is a peer no more than a dead one is).
  void broke_protocol(std::size_t p, const std::string& how) {
    std::lock_guard lock(m_);
    ended_[p] = true;
    lose(p, how);
    cv_.notify_all();
  }

  // Peer p's connection ended: a death unless it said its last word.
  void ended(std::size_t p, const std::string& how) {
    std::lock_guard lock(m_);
    ended_[p] = true;
    if (words_[p].empty()) lose(p, fmt::format("its process ended ({} without a last word)", how));
    cv_.notify_all();
  }

  // Called with m_ held.
  void lose(std::size_t r, std::string how) {
    if (lost_) return;
    lost_ = r;
    how_ = std::move(how);
    interrupt();
    cv_.notify_all();
  }

  // The handshake's messages (fixed size, host byte order: the peers run the same build).
  struct greeting {
    std::uint64_t rank;
    load_secret::nonce_t nonce;
  };
  struct answer {
    load_secret::nonce_t nonce;
    load_secret::proof_t proof;
  };
  static std::string peer_name(const sockaddr_storage& sa) {
    char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
    (void)::getnameinfo(reinterpret_cast<const sockaddr*>(&sa), sizeof sa, host, sizeof host, port, sizeof port,
                        NI_NUMERICHOST | NI_NUMERICSERV);
    return fmt::format("{}:{}", host, port);
  }

  static constexpr std::size_t max_line = 4096;
  std::size_t refused_ = 0;
  std::size_t rank_;
  int listen_ = -1, wake_ = -1;
  std::string address_;
  std::vector<int> fds_;  // per peer; -1 for this rank (closed only by the destructor)
  std::thread thread_;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::string> words_;    // each peer's last word
  std::vector<std::uint64_t> at_;     // the collective each peer last started
  std::vector<bool> ended_;           // its connection ended
  std::optional<std::size_t> lost_;
  std::string how_;
  bool told_ = false, timeout_word_ = false, said_ = false;
  std::uint64_t seq_ = 0;
  std::vector<::gloo::transport::UnboundBuffer*> armed_;
};

}  // namespace sluice::inline v0::comm::detail
