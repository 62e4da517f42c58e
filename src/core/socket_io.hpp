#pragma once
// Exact-size sends and receives on a non-blocking socket until a deadline,
// for the handshakes of sluice's own listeners (private to src: the peer
// watch in src/gloo, the node's memory handoff in src/memory).
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstddef>

namespace sluice::inline v0::detail {

using socket_clock = std::chrono::steady_clock;

// Waits until `fd` is ready for `what` or `until`; false on a timeout
// (errno ETIMEDOUT) or an error.
inline bool wait_for(int fd, short what, socket_clock::time_point until) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - socket_clock::now()).count();
  if (ms <= 0) return errno = ETIMEDOUT, false;
  pollfd pf{fd, what, 0};
  const int n = ::poll(&pf, 1, static_cast<int>(ms));
  if (n == 0) errno = ETIMEDOUT;
  return n == 1;
}

// Exactly `n` bytes, or false on a timeout, an error or the peer closing
// (errno says which; ECONNRESET for a close).
inline bool send_all(int fd, const void* p, std::size_t n, socket_clock::time_point until) {
  auto* b = static_cast<const char*>(p);
  while (n) {
    const auto r = ::send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r > 0) {
      b += r, n -= static_cast<std::size_t>(r);
      continue;
    }
    if (r < 0 && errno != EAGAIN && errno != EINTR) return false;
    if (!wait_for(fd, POLLOUT, until)) return false;
  }
  return true;
}
inline bool recv_all(int fd, void* p, std::size_t n, socket_clock::time_point until) {
  auto* b = static_cast<char*>(p);
  while (n) {
    const auto r = ::recv(fd, b, n, MSG_DONTWAIT);
    if (r > 0) {
      b += r, n -= static_cast<std::size_t>(r);
      continue;
    }
    if (r == 0) return errno = ECONNRESET, false;
    if (errno != EAGAIN && errno != EINTR) return false;
    if (!wait_for(fd, POLLIN, until)) return false;
  }
  return true;
}

}  // namespace sluice::inline v0::detail
