#pragma once
// A redis-server of our own on a free loopback port, for rendezvous tests
// (Debian's redis-server, installed by scripts/setup.sh; absent: port() is 0
// and ready() false, and the test skips). Used by the Gloo and NCCL
// rendezvous tests.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

namespace sluice_test {

// A redis-server of our own on a free loopback port (Debian's redis-server,
// installed by scripts/setup.sh), stopped with the object.
class redis_server {
 public:
  /// `password`: the server requires it (--requirepass); empty: none.
  explicit redis_server(const std::string& password = {}) {
    if (::access("/usr/bin/redis-server", X_OK) != 0) return;
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ::close(s);
      return;
    }
    port_ = ntohs(a.sin_port);
    ::close(s);
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string port = std::to_string(port_);
      if (password.empty())
        ::execl("/usr/bin/redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning", static_cast<char*>(nullptr));
      else
        ::execl("/usr/bin/redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning", "--requirepass", password.c_str(),
                static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Ready when it accepts a connection (at most ~5 s).
    for (int i = 0; i < 100 && !ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ~redis_server() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  redis_server(const redis_server&) = delete;
  redis_server& operator=(const redis_server&) = delete;
  [[nodiscard]] bool ready() const {
    if (pid_ <= 0) return false;
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(s);
    return ok;
  }
  [[nodiscard]] int port() const noexcept { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};
}  // namespace sluice_test
