// reports_free_memory, file_mapping_huge_pages, shmem_huge_faults (memory/page_reporting.hpp).

#include <sluice/memory/page_reporting.hpp>

#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

#include <fmt/format.h>

#include <sluice/error.hpp>

namespace sluice::inline v0 {

namespace {
constexpr std::size_t balloon_f_reporting = 5;  // VIRTIO_BALLOON_F_REPORTING, linux/virtio_balloon.h
}

bool reports_free_memory(const std::filesystem::path& sys) {
  std::error_code ec;
  const auto drivers = sys / "bus" / "virtio" / "drivers" / "virtio_balloon";
  for (std::filesystem::directory_iterator it(drivers, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->path().filename().string().starts_with("virtio")) continue;  // bind, unbind, module, ...
    std::ifstream f(it->path() / "features");
    std::string bits;
    if (f >> bits && bits.size() > balloon_f_reporting && bits[balloon_f_reporting] == '1') return true;
  }
  return false;
}

namespace detail {
bool file_mapping_huge_pages(const char* setting, const std::filesystem::path& sys) {
  const std::string_view v = setting ? setting : "";
  if (v == "on") return true;
  if (v == "off") return false;
  if (v.empty() || v == "auto") return !reports_free_memory(sys);
  throw config_error(fmt::format("SLUICE_FILE_HUGEPAGES='{}': expected on, off or auto", printable(v, 64)));
}

bool shmem_huge_faults(const std::filesystem::path& sys) {
  // One line, every policy listed, the system's in brackets:
  // "always within_size advise [never] deny force".
  std::ifstream f(sys / "kernel" / "mm" / "transparent_hugepage" / "shmem_enabled");
  std::string line;
  if (!std::getline(f, line)) return false;  // no THP for shmem here
  const auto b = line.find('['), e = line.find(']');
  if (b == std::string::npos || e == std::string::npos || e < b) return false;
  const auto policy = line.substr(b + 1, e - b - 1);
  return policy != "never" && policy != "deny" && !reports_free_memory(sys);
}
}  // namespace detail

bool shmem_huge_faults() {
  static const bool on = detail::shmem_huge_faults("/sys");
  return on;
}

bool file_mapping_huge_pages() {
  static const bool on = detail::file_mapping_huge_pages(std::getenv("SLUICE_FILE_HUGEPAGES"), "/sys");
  return on;
}

}  // namespace sluice::inline v0
