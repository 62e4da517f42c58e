// The safetensors writer's header and file output, compiled once (writer.hpp).

#include <sluice/format/writer.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace sluice::inline v0::format {

std::string writer::header_json() const {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata_.empty()) j["__metadata__"] = metadata_;
  for (const auto& e : entries_)
    j[e.name] = {{"dtype", std::string(name(e.type))}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  std::string s = j.dump();
  const std::uint64_t padded = (8 + s.size() + alignment_ - 1) / alignment_ * alignment_ - 8;
  s.append(padded - s.size(), ' ');
  return s;
}

void writer::write(const std::filesystem::path& path, std::size_t chunk) const {
  chunk = std::max<std::size_t>(chunk, 1);
  for (const auto& e : entries_)
    if (!e.fill && e.end > e.begin) throw config_error(fmt::format("writer: tensor '{}' has no fill function", e.name));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw io_error(fmt::format("cannot create: {}", std::strerror(errno)), {path.string()}, errno);
  struct closer { int fd; ~closer() { ::close(fd); } } c{fd};
  const std::string hdr = header_json();
  std::vector<std::byte> buf(std::max<std::size_t>(chunk, 8 + hdr.size()));
  const std::uint64_t n = hdr.size();
  for (int i = 0; i < 8; ++i) buf[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(buf.data() + 8, hdr.data(), hdr.size());
  write_all(fd, {buf.data(), 8 + hdr.size()}, path);
  buf.resize(chunk);
  for (const auto& e : entries_) {
    for (std::uint64_t off = 0; off < e.end - e.begin;) {
      const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, e.end - e.begin - off));
      e.fill(off, {buf.data(), len});
      write_all(fd, {buf.data(), len}, path);
      off += len;
    }
  }
}

void writer::write_all(int fd, std::span<const std::byte> data, const std::filesystem::path& path) {
  while (!data.empty()) {
    const auto w = ::write(fd, data.data(), data.size());
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw io_error(fmt::format("write failed: {}", std::strerror(errno)), {path.string()}, errno);
    data = data.subspan(static_cast<std::size_t>(w));
  }
}

}  // namespace sluice::inline v0::format
