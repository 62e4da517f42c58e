#pragma once
// A temporary directory removed at scope exit (tests/format only).
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace sluice_test {

class temp_dir {
 public:
  explicit temp_dir(const std::string& tag = "fmt") {
    static std::atomic<int> n{0};
    path_ = std::filesystem::temp_directory_path() /
            ("sluice-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::vector<std::byte> read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return {reinterpret_cast<const std::byte*>(c.data()), reinterpret_cast<const std::byte*>(c.data()) + c.size()};
}

}  // namespace sluice_test
