#pragma once
// A temporary directory removed at scope exit (by the process that made it:
// a forked rank that exits through exit() leaves it to its parent), and a
// safetensors file's bytes.
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace sluice_test {

class temp_dir {
 public:
  explicit temp_dir(const std::string& tag = "test") {
    static std::atomic<int> n{0};
    path_ = std::filesystem::temp_directory_path() /
            ("sluice-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~temp_dir() {
    if (::getpid() != owner_) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
  pid_t owner_ = ::getpid();
};

/// A whole safetensors file in memory: 8-byte little-endian length, `json`, `data_bytes` zero bytes.
inline std::vector<std::byte> safetensors_file(const std::string& json, std::size_t data_bytes) {
  std::vector<std::byte> f(8 + json.size() + data_bytes);
  const std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) f[static_cast<std::size_t>(i)] = static_cast<std::byte>(n >> (8 * i));
  std::memcpy(f.data() + 8, json.data(), json.size());
  return f;
}

inline std::vector<std::byte> read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return {reinterpret_cast<const std::byte*>(c.data()), reinterpret_cast<const std::byte*>(c.data()) + c.size()};
}

}  // namespace sluice_test
