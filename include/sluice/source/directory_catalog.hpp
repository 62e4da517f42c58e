#pragma once
/// \file
/// A catalog over a local directory (pread for metadata; the data path it
/// opens is a file_source over an io_uring of its own).

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include <sluice/error.hpp>
#include <sluice/source/concepts.hpp>

namespace sluice::inline v0 {

class directory_catalog final : public catalog {
 public:
  explicit directory_catalog(std::filesystem::path dir) : dir_(std::move(dir)) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir_, ec))
      throw io_error(fmt::format("not a directory{}", ec ? ": " + ec.message() : std::string{}), {dir_.string()}, ec.value());
  }
  [[nodiscard]] std::string location() const override { return dir_.string(); }
  [[nodiscard]] std::string uri(const std::string& name) const override { return (dir_ / name).string(); }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return dir_; }
  [[nodiscard]] bool shares_page_cache() const override { return true; }
  /// A file_source over the shards on an io_uring of its own, bound to `ioc`
  /// (ring entries: opt.ring_entries, at least the queue depth), with a
  /// queue depth of sizing.queue_depth(opt.queue_depth); cancel() cancels the
  /// ring's reads. Compiled in the library (src/core/directory_catalog.cpp).
  [[nodiscard]] std::unique_ptr<any_source> open_source(const checkpoint& ck, asio::io_context& ioc,
                                                        const source_options& opt, const reader_sizing& sizing) override;

  [[nodiscard]] std::vector<std::string> list() override {
    std::vector<std::string> out;
    std::error_code ec;
    for (auto it = std::filesystem::directory_iterator(dir_, ec); !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
      if (it->is_regular_file(ec)) out.push_back(it->path().filename().string());
    if (ec) throw io_error(fmt::format("cannot list: {}", ec.message()), {dir_.string()}, ec.value());
    std::sort(out.begin(), out.end());
    return out;
  }
  [[nodiscard]] bool exists(const std::string& name) override {
    struct stat st{};
    return ::stat(uri(name).c_str(), &st) == 0 && S_ISREG(st.st_mode);
  }
  [[nodiscard]] std::uint64_t size(const std::string& name) override {
    struct stat st{};
    if (::stat(uri(name).c_str(), &st) != 0)
      throw io_error(fmt::format("cannot stat: {}", std::strerror(errno)), {uri(name)}, errno);
    return static_cast<std::uint64_t>(st.st_size);
  }
  /// Checks that this directory's `name` has the size the opening rank saw
  /// (a node whose copy differs would otherwise read its tensors at offsets
  /// from another file's header).
  void adopt(const std::string& name, std::uint64_t opened_size, const std::optional<std::string>& etag) override {
    (void)etag;
    const auto own = size(name);
    if (own != opened_size)
      throw format_error("stale-shard",
                         fmt::format("shard '{}' is {} bytes here, but {} bytes where the checkpoint was opened", name,
                                     own, opened_size),
                         {uri(name)});
  }
  [[nodiscard]] std::vector<std::byte> read(const std::string& name, std::uint64_t offset, std::uint64_t length) override {
    const auto p = uri(name);
    // The descriptor closes on every path out (a failed allocation included).
    struct fd_guard {
      int fd;
      ~fd_guard() {
        if (fd >= 0) ::close(fd);
      }
    } f{::open(p.c_str(), O_RDONLY | O_CLOEXEC)};
    if (f.fd < 0) throw io_error(fmt::format("cannot open: {}", std::strerror(errno)), {p}, errno);
    counters_.files_opened.fetch_add(1, std::memory_order_relaxed);
    // Sized from what the file holds, not from what was asked: a caller's
    // length taken from a stranger's metadata never sizes memory beyond the file.
    struct stat st{};
    if (::fstat(f.fd, &st) != 0) throw io_error(fmt::format("cannot stat: {}", std::strerror(errno)), {p}, errno);
    const auto file_size = static_cast<std::uint64_t>(st.st_size);
    const std::uint64_t available = offset < file_size ? file_size - offset : 0;
    std::vector<std::byte> buf(std::min(length, available));
    std::uint64_t got = 0;
    while (got < buf.size()) {
      const auto r = ::pread(f.fd, buf.data() + got, buf.size() - got, static_cast<off_t>(offset + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        const int e = errno;
        throw io_error(fmt::format("read failed: {}", std::strerror(e)), {p, "", byte_range{offset, offset + length}}, e);
      }
      if (r == 0) break;
      got += static_cast<std::uint64_t>(r);
    }
    buf.resize(got);
    counters_.bytes_read.fetch_add(got, std::memory_order_relaxed);
    counters_.requests.fetch_add(1, std::memory_order_relaxed);
    return buf;
  }

 private:
  std::filesystem::path dir_;
};

}  // namespace sluice::inline v0
