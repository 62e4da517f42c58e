#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sluice/memory/shared_host.hpp>

#include "../comm/multiprocess.hpp"

using namespace sluice;

namespace {
// A segment name no other process uses, and the /dev/shm entries named by
// it: only what this test made is counted (other processes on a busy machine
// create and remove shared memory meanwhile).
std::string unique_name(const char* tag) { return fmt::format("sluice-test-{}-{}", tag, ::getpid()); }
std::size_t dev_shm_entries(const std::string& prefix) {
  std::size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/dev/shm", ec); !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    n += it->path().filename().string().starts_with(prefix) ? 1 : 0;
  return n;
}
}  // namespace

TEST_CASE("every local process maps the same shared segment and sees the others' writes", "[memory][shared_host]") {
  const auto name = unique_name("shared");
  constexpr std::size_t size = 4u << 20, ranks = 4;
  auto seg = memory::shared_host::create(size, name);
  REQUIRE(reinterpret_cast<std::uintptr_t>(seg.bytes().data()) % 4096 == 0);
  const auto handle = seg.handle();
  // Each child attaches and writes its own quarter (a cooperative load).
  auto res = sluice_test::run_ranks(ranks, [&](std::size_t r) {
    auto mine = memory::shared_host::attach(handle, size);
    auto b = mine.bytes().subspan(r * size / ranks, size / ranks);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>((r + i) & 0xff);
    return 0;
  });
  for (auto& x : res) REQUIRE(x.code == 0);
  for (std::size_t r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < size / ranks; i += 977) REQUIRE(seg.bytes()[r * size / ranks + i] == static_cast<std::byte>((r + i) & 0xff));
  seg.close_handle();
  REQUIRE(seg.size() == size);  // still mapped
  REQUIRE(dev_shm_entries(name) == 0);  // a memfd never has a /dev/shm name
}

TEST_CASE("attaching after the creator closed its handle fails cleanly", "[memory][shared_host]") {
  auto seg = memory::shared_host::create(8192);
  const auto handle = seg.handle();
  REQUIRE_THROWS_AS(memory::shared_host::attach(handle, 4096), io_error);  // wrong size
  seg.close_handle();
  REQUIRE_THROWS_AS(seg.handle(), config_error);
  REQUIRE_THROWS_AS(memory::shared_host::attach(handle, 8192), io_error);
}

TEST_CASE("the segment is sealed: no holder can resize it under a rank that maps it, and attach maps nothing else",
          "[memory][shared_host][hostile]") {
  auto seg = memory::shared_host::create(8192, unique_name("sealed"));
  const auto handle = seg.handle();
  // A local process that opens the handle (a rank, or anyone who can) cannot
  // shrink or grow it: a shrink would make every mapper's reads SIGBUS.
  const int fd = ::open(handle.c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(fd >= 0);
  errno = 0;
  CHECK(::ftruncate(fd, 0) != 0);
  CHECK(errno == EPERM);
  CHECK(::ftruncate(fd, 1 << 20) != 0);
  CHECK(::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) != 0);   // the seals themselves are sealed
  ::close(fd);
  seg.bytes()[8191] = std::byte{7};
  REQUIRE(memory::shared_host::attach(handle, 8192).bytes()[8191] == std::byte{7});

  // What attach refuses, naming the handle: a plain file of the right size
  // (the handle a hostile peer could send), an unsealed memfd, a directory.
  const auto dir = std::filesystem::temp_directory_path() / unique_name("attach");
  std::filesystem::create_directories(dir);
  const auto plain = (dir / "segment").string();
  {
    const int f = ::open(plain.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(f >= 0);
    REQUIRE(::ftruncate(f, 8192) == 0);
    ::close(f);
  }
  const int loose = ::memfd_create("sluice-test-unsealed", MFD_CLOEXEC);
  REQUIRE(loose >= 0);
  REQUIRE(::ftruncate(loose, 8192) == 0);
  const auto loose_handle = fmt::format("/proc/{}/fd/{}", ::getpid(), loose);
  for (const auto& h : {plain, loose_handle, dir.string()}) {
    INFO(h);
    REQUIRE_THROWS_AS(memory::shared_host::attach(h, 8192), io_error);
    try {
      (void)memory::shared_host::attach(h, 8192);
    } catch (const io_error& e) {
      CHECK_THAT(e.what(), Catch::Contains(h));
      if (h != dir.string()) CHECK_THAT(e.what(), Catch::Contains("not a sealed sluice segment"));
    }
  }
  ::close(loose);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a view's lease keeps the segment mapped after the segment object goes", "[memory][shared_host]") {
  std::shared_ptr<void> keep;
  std::span<std::byte> bytes;
  {
    auto seg = memory::shared_host::create(4096);
    bytes = seg.bytes();
    keep = seg.keep();
  }
  bytes[0] = std::byte{1};
  REQUIRE(bytes[0] == std::byte{1});
}

TEST_CASE("a creator killed mid-run leaves no /dev/shm entry, and its segment lives on in the ranks that mapped it",
          "[memory][shared_host]") {
  const auto name = unique_name("crash");
  int to_parent[2];
  REQUIRE(::pipe(to_parent) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // the creator: make the segment, publish the handle, then wait to be killed
    ::close(to_parent[0]);
    auto seg = memory::shared_host::create(1u << 20, name);
    seg.bytes()[123] = std::byte{42};
    const auto h = seg.handle() + "\n";
    (void)!::write(to_parent[1], h.data(), h.size());
    for (;;) ::pause();
  }
  ::close(to_parent[1]);
  std::string handle;
  char ch = 0;
  while (::read(to_parent[0], &ch, 1) == 1 && ch != '\n') handle += ch;
  ::close(to_parent[0]);
  REQUIRE_FALSE(handle.empty());
  auto mine = memory::shared_host::attach(handle, 1u << 20);
  REQUIRE(::kill(child, SIGKILL) == 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFSIGNALED(status));
  // Nothing named was ever created, so nothing is left behind ...
  REQUIRE(dev_shm_entries(name) == 0);
  // ... the creator's handle is gone with it (a late rank gets a clean error) ...
  REQUIRE_THROWS_AS(memory::shared_host::attach(handle, 1u << 20), io_error);
  // ... and a rank that had mapped it keeps valid memory until it lets go.
  REQUIRE(mine.bytes()[123] == std::byte{42});
}

TEST_CASE("a segment in pieces is one contiguous mapping, written through each piece's descriptor", "[memory][shared_host]") {
  constexpr std::size_t size = 5 * 4096;
  const std::vector<std::uint64_t> pieces{0, 4096, 3 * 4096};
  auto seg = memory::shared_host::create(size, unique_name("pieces"), pieces);
  REQUIRE(seg.fds().size() == 3);
  REQUIRE(std::vector<std::uint64_t>(seg.pieces().begin(), seg.pieces().end()) == pieces);
  // A write across both boundaries lands where the mapping says, and every
  // piece is sealed as a one-piece segment is.
  std::vector<std::byte> src(3 * 4096 + 100);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 7 + 1);
  seg.write(4000, src);
  for (std::size_t i = 0; i < src.size(); ++i) REQUIRE(seg.bytes()[4000 + i] == src[i]);
  REQUIRE(seg.bytes()[3999] == std::byte{0});
  for (int fd : seg.fds()) {
    CHECK(::ftruncate(fd, 0) != 0);
    CHECK(::fcntl(fd, F_GET_SEALS) & F_SEAL_GROW);
  }
  // The other ways in: the pieces' bytes through the mapping are the same memory.
  seg.bytes()[size - 1] = std::byte{9};
  std::byte last{};
  REQUIRE(::pread(seg.fds()[2], &last, 1, 2 * 4096 - 1) == 1);
  REQUIRE(last == std::byte{9});
  REQUIRE_THROWS_AS(seg.handle(), config_error);  // no one path names three pieces
  REQUIRE_THROWS_AS(seg.write(size - 10, std::span(src).first(11)), usage_error);
  seg.close_handle();
  REQUIRE(seg.fds().empty());
  REQUIRE_THROWS_AS(seg.write(0, std::span(src).first(1)), usage_error);
  REQUIRE(seg.bytes()[4000] == src[0]);  // still mapped

  // Layouts that are not pieces of it: a config error naming them.
  for (const auto& bad : std::vector<std::vector<std::uint64_t>>{{4096}, {0, 100}, {0, 8192, 4096}, {0, size}}) {
    INFO(fmt::format("{}", fmt::join(bad, ",")));
    REQUIRE_THROWS_AS(memory::shared_host::create(size, "sluice-test-bad", bad), config_error);
  }
}

TEST_CASE("a rank releases its share of the pieces: their memory goes back in every mapping, the others' stays",
          "[memory][shared_host]") {
  constexpr std::size_t page = 4096, size = 6 * page;
  const std::vector<std::uint64_t> pieces{0, 2 * page, 3 * page, 5 * page};  // 2, 1, 2 and 1 pages
  auto seg = memory::shared_host::create(size, unique_name("release"), pieces);
  std::vector<int> dups;
  for (int fd : seg.fds()) dups.push_back(::dup(fd));
  auto other = memory::shared_host::adopt(dups, size, pieces);  // another local rank's mapping of it
  std::memset(seg.bytes().data(), 0x5a, size);
  // Whether anything else in the process still holds the mapping.
  CHECK(seg.sole());
  {
    auto hold = seg.keep();
    CHECK_FALSE(seg.sole());
    auto copy = seg;
    CHECK_FALSE(copy.sole());
  }
  CHECK(seg.sole());
  CHECK_FALSE(memory::shared_host{}.sole());

  // Rank 1 of 2 releases pieces 1 and 3 through its own mapping.
  REQUIRE(other.release(1, 2) == 2 * page);
  auto blocks = [&](std::size_t i) {
    struct stat st {};
    REQUIRE(::fstat(seg.fds()[i], &st) == 0);
    return st.st_blocks;
  };
  CHECK(blocks(1) == 0);
  CHECK(blocks(3) == 0);
  CHECK(blocks(0) > 0);
  CHECK(blocks(2) > 0);
  std::size_t wrong = 0;
  for (std::size_t b = 0; b < size; ++b) {
    const bool released = (b >= 2 * page && b < 3 * page) || b >= 5 * page;
    wrong += seg.bytes()[b] != (released ? std::byte{0} : std::byte{0x5a});
  }
  CHECK(wrong == 0);
  REQUIRE(seg.release(0, 2) == 4 * page);
  CHECK(blocks(0) == 0);
  CHECK(other.bytes()[0] == std::byte{0});
  CHECK(seg.release(4, 2) == 0);  // a rank past the pieces has none
  CHECK(seg.release(0, 0) == 0);
  CHECK(memory::shared_host{}.release(0, 1) == 0);
}

TEST_CASE("adopting pieces checks each: their count, seals and sizes, naming the piece", "[memory][shared_host][hostile]") {
  const std::vector<std::uint64_t> pieces{0, 4096};
  auto seg = memory::shared_host::create(3 * 4096, unique_name("adopt"), pieces);
  auto dup = [&](std::size_t i) { return ::fcntl(seg.fds()[i], F_DUPFD_CLOEXEC, 0); };
  // The right descriptors: the same memory.
  auto again = memory::shared_host::adopt({dup(0), dup(1)}, 3 * 4096, pieces);
  again.bytes()[5000] = std::byte{3};
  REQUIRE(seg.bytes()[5000] == std::byte{3});
  // One descriptor short, the pieces swapped (sizes 4096 and 8192), an unsealed memfd in place of one.
  CHECK_THROWS_WITH(memory::shared_host::adopt({dup(0)}, 3 * 4096, pieces), Catch::Contains("1 pieces, expected 2"));
  CHECK_THROWS_WITH(memory::shared_host::adopt({dup(1), dup(0)}, 3 * 4096, pieces),
                    Catch::Contains("piece 0: it has 8192 bytes, expected 4096"));
  const int loose = ::memfd_create("sluice-test-unsealed", MFD_CLOEXEC);
  REQUIRE(::ftruncate(loose, 8192) == 0);
  CHECK_THROWS_WITH(memory::shared_host::adopt({dup(0), loose}, 3 * 4096, pieces), Catch::Contains("piece 1: not a sealed sluice segment"));
}

TEST_CASE("a write whose source cannot be read fails with an io_error, not a signal", "[memory][shared_host][hostile]") {
  // The source: a view of a file cut after it was mapped (a file changed under a load).
  const auto path = std::filesystem::temp_directory_path() / unique_name("cut");
  const int f = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  REQUIRE(f >= 0);
  REQUIRE(::ftruncate(f, 3 * 4096) == 0);
  void* m = ::mmap(nullptr, 3 * 4096, PROT_READ, MAP_SHARED, f, 0);
  REQUIRE(m != MAP_FAILED);
  REQUIRE(::ftruncate(f, 4096) == 0);
  auto seg = memory::shared_host::create(4 * 4096, unique_name("cut"), std::vector<std::uint64_t>{0, 8192});
  try {
    seg.write(0, std::span(static_cast<const std::byte*>(m), 3 * 4096));
    FAIL("the write went through");
  } catch (const io_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("its source could not be read"));
    CHECK_THAT(e.what(), Catch::Contains("shared segment"));
  }
  ::munmap(m, 3 * 4096);
  ::close(f);
  std::filesystem::remove(path);
}
