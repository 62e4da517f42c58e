// The node's memory handoff (memory/node_handoff.hpp): SCM_RIGHTS over an
// abstract Unix socket, to this user's processes that prove the token.

#include <sluice/memory/node_handoff.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include <sluice/comm/concepts.hpp>
#include <sluice/error.hpp>

#include "../core/socket_io.hpp"

namespace sluice::inline v0::memory {

using detail::recv_all;
using detail::send_all;
using detail::wait_for;

namespace {
using clock = std::chrono::steady_clock;
constexpr std::size_t name_bytes = 32;  // hex of 16 random bytes
constexpr std::size_t ticket_bytes = name_bytes + comm::load_secret::size;

sockaddr_un address_of(const std::string& name, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  a.sun_path[0] = '\0';  // the abstract namespace: no file to leave behind or to be swapped
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

// The peer's uid and pid (SO_PEERCRED), or nullopt.
std::optional<ucred> peer_of(int fd) {
  ucred c{};
  socklen_t len = sizeof c;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0) return std::nullopt;
  return c;
}

// The handshake's messages.
struct answer {
  comm::load_secret::nonce_t nonce;
  comm::load_secret::proof_t proof;
};
}  // namespace

handoff_server::handoff_server(shared_host mem, std::function<void(const std::string&)> warn)
    : mem_(std::move(mem)), warn_(warn ? std::move(warn) : [](const std::string& m) { std::fprintf(stderr, "sluice: %s\n", m.c_str()); }) {
  if (mem_.fds().empty()) throw config_error("node handoff: the memory has no descriptor (closed)");
  if (mem_.fds().size() > max_pieces)
    throw config_error(fmt::format("node handoff: {} pieces, more than the {} one message carries", mem_.fds().size(), max_pieces));
  token_ = comm::load_secret::draw();
  const auto n = comm::load_secret::nonce();
  for (auto b : n) name_ += fmt::format("{:02x}", static_cast<unsigned>(b));
  listen_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_ < 0) throw io_error(fmt::format("node handoff: socket: {}", std::strerror(errno)), {}, errno);
  socklen_t len = 0;
  const auto a = address_of(name_, len);
  if (::bind(listen_, reinterpret_cast<const sockaddr*>(&a), len) != 0 || ::listen(listen_, SOMAXCONN) != 0) {
    const int e = errno;
    ::close(listen_);
    throw io_error(fmt::format("node handoff: cannot listen on a Unix socket: {}", std::strerror(e)), {}, e);
  }
}

handoff_server::~handoff_server() {
  if (listen_ >= 0) ::close(listen_);
}

std::vector<std::byte> handoff_server::ticket() const {
  std::vector<std::byte> t(ticket_bytes);
  std::memcpy(t.data(), name_.data(), name_bytes);
  const auto k = token_->bytes();
  std::memcpy(t.data() + name_bytes, k.data(), k.size());
  return t;
}

void handoff_server::serve(std::size_t receivers, std::chrono::milliseconds timeout, const std::function<void()>& alive) {
  const auto deadline = clock::now() + timeout;
  for (std::size_t served = 0; served < receivers;) {
    if (alive) alive();
    if (clock::now() > deadline)
      throw comm::comm_error(fmt::format("node handoff: {} of {} local ranks took the node's memory within {} ms{}", served, receivers,
                                   timeout.count(),
                                   refused_ ? fmt::format(" ({} connection(s) refused)", refused_) : std::string()));
    if (!wait_for(listen_, POLLIN, std::min(deadline, clock::now() + std::chrono::milliseconds(100)))) continue;
    const int fd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    const auto until = std::min(deadline, clock::now() + std::chrono::seconds(5));  // a silent stranger, at most this
    std::string why;
    const auto who = peer_of(fd);
    comm::load_secret::nonce_t theirs{};
    answer mine{comm::load_secret::nonce(), {}};
    comm::load_secret::proof_t proof{};
    if (!who || who->uid != ::geteuid()) {
      why = who ? fmt::format("it runs as uid {}, not this user", who->uid) : std::string("no peer credentials");
    } else if (!recv_all(fd, theirs.data(), theirs.size(), until)) {
      why = "no greeting";
    } else {
      mine.proof = token_->prove("sluice-handoff-server", 0, 1, mine.nonce, theirs);
      if (!send_all(fd, &mine, sizeof mine, until) || !recv_all(fd, proof.data(), proof.size(), until))
        why = "no proof";
      else if (!token_->check(proof, "sluice-handoff-receiver", 1, 0, theirs, mine.nonce))
        why = "a wrong proof";
    }
    if (why.empty()) {
      // The descriptors themselves (one per piece), with the size and the
      // count: the receiver checks them against its plan.
      const auto fds = mem_.fds();
      const std::uint64_t head[2] = {mem_.size(), fds.size()};
      iovec iov{const_cast<std::uint64_t*>(head), sizeof head};
      std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
      msghdr msg{};
      msg.msg_iov = &iov, msg.msg_iovlen = 1;
      msg.msg_control = control.data(), msg.msg_controllen = control.size();
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
      if (::sendmsg(fd, &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof head)) why = fmt::format("sendmsg: {}", std::strerror(errno));
    }
    ::close(fd);
    if (!why.empty()) {
      if (refused_++ == 0)
        warn_(fmt::format("node handoff: refused a connection from pid {} ({}); still waiting for the node's ranks",
                          who ? std::to_string(who->pid) : std::string("?"), why));
      continue;
    }
    ++served;
  }
}

shared_host receive_handoff(std::span<const std::byte> ticket, std::size_t size, std::span<const std::uint64_t> pieces,
                            std::chrono::milliseconds timeout) {
  auto fail = [](const std::string& why) -> void { throw io_error(fmt::format("node handoff: {}", why)); };
  if (ticket.size() < ticket_bytes) fail(fmt::format("a ticket of {} bytes, expected {}", ticket.size(), ticket_bytes));
  const std::string name(reinterpret_cast<const char*>(ticket.data()), name_bytes);
  const auto token = comm::load_secret::from(ticket.subspan(name_bytes, comm::load_secret::size));
  const auto until = clock::now() + timeout;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) fail(fmt::format("socket: {}", std::strerror(errno)));
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } close_fd{fd};
  socklen_t len = 0;
  const auto a = address_of(name, len);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0 && errno != EINPROGRESS)
    fail(fmt::format("cannot reach the local rank that made the memory: {}", std::strerror(errno)));
  if (!wait_for(fd, POLLOUT, until)) fail(fmt::format("cannot reach the local rank that made the memory: {}", std::strerror(errno)));
  const auto who = peer_of(fd);
  if (!who || who->uid != ::geteuid())
    fail(who ? fmt::format("the handoff's socket belongs to uid {}, not this user", who->uid) : "no peer credentials");
  const auto mine = comm::load_secret::nonce();
  answer theirs{};
  if (!send_all(fd, mine.data(), mine.size(), until) || !recv_all(fd, &theirs, sizeof theirs, until))
    fail(fmt::format("the local rank that made the memory did not answer: {}", std::strerror(errno)));
  if (!token.check(theirs.proof, "sluice-handoff-server", 0, 1, theirs.nonce, mine))
    fail("whoever holds the handoff's socket did not prove the load's token: refusing its memory");
  const auto proof = token.prove("sluice-handoff-receiver", 1, 0, mine, theirs.nonce);
  if (!send_all(fd, proof.data(), proof.size(), until)) fail(fmt::format("cannot answer: {}", std::strerror(errno)));
  std::uint64_t head[2] = {0, 0};  // size, pieces
  iovec iov{head, sizeof head};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * max_pieces));
  msghdr msg{};
  msg.msg_iov = &iov, msg.msg_iovlen = 1;
  msg.msg_control = control.data(), msg.msg_controllen = control.size();
  ssize_t n = -1;
  while ((n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT)) < 0 && (errno == EAGAIN || errno == EINTR))
    if (!wait_for(fd, POLLIN, until)) fail(fmt::format("no memory came: {}", std::strerror(errno)));
  std::vector<int> fds;  // every descriptor that came, closed by adopt or below
  if (n >= 0)
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len >= CMSG_LEN(0)) {
        const auto k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const auto at = fds.size();
        fds.resize(at + k);
        std::memcpy(fds.data() + at, CMSG_DATA(c), k * sizeof(int));
      }
  auto refuse = [&](const std::string& why) {
    for (int f : fds) ::close(f);
    fail(why);
  };
  if (n != static_cast<ssize_t>(sizeof head) || fds.empty() || (msg.msg_flags & MSG_CTRUNC))
    refuse("the local rank that made the memory sent no descriptor");
  if (head[0] != size) refuse(fmt::format("the memory handed over has {} bytes, the plan says {}", head[0], size));
  const auto expected = pieces.empty() ? std::size_t{1} : pieces.size();
  if (head[1] != fds.size() || fds.size() != expected)
    refuse(fmt::format("the memory handed over comes in {} pieces ({} descriptors), the plan says {}", head[1], fds.size(), expected));
  return shared_host::adopt(std::move(fds), size, pieces, "the node's memory (handed over)");
}

}  // namespace sluice::inline v0::memory
