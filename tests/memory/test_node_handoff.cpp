// tests for <sluice/memory/node_handoff.hpp>: the node's memory handed over as
// a descriptor, only to connections that prove the token.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <sluice/memory/node_handoff.hpp>

using namespace sluice;
using namespace std::chrono_literals;

namespace {
// A raw connection to the server named in `ticket` (the abstract socket).
int connect_raw(const std::vector<std::byte>& ticket) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, ticket.data(), 32);
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + 32);
  REQUIRE(::connect(fd, reinterpret_cast<const sockaddr*>(&a), len) == 0);
  return fd;
}
}  // namespace

TEST_CASE("the node's memory is handed over as a descriptor to the ranks that prove the token, the same bytes",
          "[memory][handoff][secret]") {
  constexpr std::size_t size = 1u << 20;
  auto mem = memory::shared_host::create(size, "sluice-test-handoff");
  std::memset(mem.bytes().data(), 0x3c, size);
  std::vector<std::string> warned;
  memory::handoff_server server(mem, [&](const std::string& m) { warned.push_back(m); });
  const auto ticket = server.ticket();
  // Before the ranks: a stranger that says nothing, one with a wrong token's
  // proof (it holds another ticket), and a ticket for the wrong size.
  const int silent = connect_raw(ticket);
  auto wrong = ticket;
  wrong.back() ^= std::byte{1};
  std::vector<memory::shared_host> got(2);
  std::string wrong_error;
  std::thread ranks([&] {
    try {
      (void)memory::receive_handoff(wrong, size, {}, 10s);
    } catch (const io_error& e) {
      wrong_error = e.what();
    }
    for (auto& g : got) g = memory::receive_handoff(ticket, size, {}, 10s);
  });
  server.serve(2, 30s);
  ranks.join();
  // The receiver with the wrong token refused the server (which proves first),
  // and the server refused it (it never answered with a proof).
  CHECK_THAT(wrong_error, Catch::Contains("did not prove the load's token"));
  CHECK(server.refused() == 2);
  REQUIRE(warned.size() == 1);  // reported once
  CHECK_THAT(warned[0], Catch::Contains("refused a connection from pid"));
  for (auto& g : got) {
    REQUIRE(g.size() == size);
    CHECK(g.bytes()[size - 1] == std::byte{0x3c});
    g.bytes()[0] = std::byte{0x11};  // the same memory, not a copy
  }
  CHECK(mem.bytes()[0] == std::byte{0x11});
  char b;
  CHECK(::recv(silent, &b, 1, 0) <= 0);  // closed by the server
  ::close(silent);
}

TEST_CASE("a receiver refuses memory of another size than the plan's, and a ticket that names no server",
          "[memory][handoff]") {
  auto mem = memory::shared_host::create(1u << 16, "sluice-test-handoff-size");
  memory::handoff_server server(mem);
  const auto ticket = server.ticket();
  std::string error;
  std::thread rank([&] {
    try {
      (void)memory::receive_handoff(ticket, 1u << 17, {}, 10s);
    } catch (const io_error& e) {
      error = e.what();
    }
  });
  server.serve(1, 30s);
  rank.join();
  CHECK_THAT(error, Catch::Contains("has 65536 bytes, the plan says 131072"));
  auto gone = ticket;
  gone[0] = std::byte{'z'};  // a name nobody listens on
  CHECK_THROWS_WITH(memory::receive_handoff(gone, 1u << 16, {}, 2s), Catch::Contains("cannot reach the local rank"));
}

TEST_CASE("a segment in pieces is handed over whole, every piece's descriptor, and a plan of other pieces is refused",
          "[memory][handoff]") {
  const std::vector<std::uint64_t> pieces{0, 4096, 3 * 4096};
  constexpr std::size_t size = 4 * 4096;
  auto mem = memory::shared_host::create(size, "sluice-test-handoff-pieces", pieces);
  memory::handoff_server server(mem);
  const auto ticket = server.ticket();
  memory::shared_host got;
  std::string error;
  std::thread ranks([&] {
    try {
      (void)memory::receive_handoff(ticket, size, std::vector<std::uint64_t>{0, 8192}, 10s);
    } catch (const io_error& e) {
      error = e.what();
    }
    got = memory::receive_handoff(ticket, size, pieces, 10s);
  });
  server.serve(2, 30s);
  ranks.join();
  CHECK_THAT(error, Catch::Contains("comes in 3 pieces (3 descriptors), the plan says 2"));
  REQUIRE(got.fds().size() == 3);  // kept for its writes
  got.write(4000, std::vector<std::byte>(200, std::byte{0x5a}));
  CHECK(mem.bytes()[4000] == std::byte{0x5a});
  CHECK(mem.bytes()[4199] == std::byte{0x5a});
  got.close_handle();
}
