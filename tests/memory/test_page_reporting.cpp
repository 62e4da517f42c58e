// tests for <sluice/memory/page_reporting.hpp>: whether a machine reports its
// free memory to a host, read from a sysfs tree (fakes of it here, each the
// shape the kernel writes), and the file mapping's huge-page rule.
#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include <sluice/error.hpp>
#include <sluice/memory/page_reporting.hpp>

#include "support/temp_dir.hpp"

using namespace sluice;

namespace {
// <root>/bus/virtio/drivers/virtio_balloon/<device>/features holding `bits`.
void balloon(const std::filesystem::path& root, const std::string& device, const std::string& bits) {
  const auto d = root / "bus" / "virtio" / "drivers" / "virtio_balloon" / device;
  std::filesystem::create_directories(d);
  std::ofstream(d / "features") << bits << "\n";
}
// The features a Firecracker-like host negotiates (bits 1, 2, 5, 7 and 32),
// and the same without REPORTING (bit 5).
const std::string reporting = "0110010100000000000000000000000010000000000000000000000000000000";
const std::string no_reporting = "0110000100000000000000000000000010000000000000000000000000000000";
}  // namespace

TEST_CASE("a machine without a balloon device reports nothing, and file mappings ask for huge pages", "[memory][page_reporting]") {
  sluice_test::temp_dir root("page-reporting");
  REQUIRE_FALSE(reports_free_memory(root.path()));
  REQUIRE_FALSE(reports_free_memory(root.path() / "missing"));
  REQUIRE(detail::file_mapping_huge_pages(nullptr, root.path()));
  REQUIRE(detail::file_mapping_huge_pages("", root.path()));
  REQUIRE(detail::file_mapping_huge_pages("auto", root.path()));
  REQUIRE_FALSE(detail::file_mapping_huge_pages("off", root.path()));
}

TEST_CASE("a balloon device with free page reporting negotiated turns the advice off unless told on", "[memory][page_reporting]") {
  sluice_test::temp_dir root("page-reporting");
  balloon(root.path(), "virtio0", reporting);
  REQUIRE(reports_free_memory(root.path()));
  REQUIRE_FALSE(detail::file_mapping_huge_pages(nullptr, root.path()));
  REQUIRE_FALSE(detail::file_mapping_huge_pages("auto", root.path()));
  REQUIRE(detail::file_mapping_huge_pages("on", root.path()));
}

TEST_CASE("a balloon device without reporting, short or empty features, and other entries report nothing",
          "[memory][page_reporting]") {
  sluice_test::temp_dir root("page-reporting");
  balloon(root.path(), "virtio3", no_reporting);
  balloon(root.path(), "virtio4", "01100");  // too short to have bit 5
  balloon(root.path(), "virtio5", "");
  balloon(root.path(), "module", reporting);  // not a device: the driver's own entries
  REQUIRE_FALSE(reports_free_memory(root.path()));
  REQUIRE(detail::file_mapping_huge_pages(nullptr, root.path()));
  balloon(root.path(), "virtio6", reporting);  // any one device that reports is enough
  REQUIRE(reports_free_memory(root.path()));
}

TEST_CASE("an unknown setting of SLUICE_FILE_HUGEPAGES is a config_error naming the variable and the value",
          "[memory][page_reporting][errors]") {
  sluice_test::temp_dir root("page-reporting");
  for (const char* bad : {"yes", "ON", "1", "auto "}) {
    INFO(bad);
    REQUIRE_THROWS_MATCHES(detail::file_mapping_huge_pages(bad, root.path()), config_error,
                           Catch::Matchers::Predicate<config_error>([&](const config_error& e) {
                             const std::string m = e.what();
                             return m.find("SLUICE_FILE_HUGEPAGES") != std::string::npos &&
                                    m.find(std::string("'") + bad + "'") != std::string::npos;
                           }));
  }
}

TEST_CASE("shmem faults take huge pages where the system's policy allows them and no host takes free memory back",
          "[memory][page_reporting]") {
  sluice_test::temp_dir root("page-reporting");
  REQUIRE_FALSE(detail::shmem_huge_faults(root.path()));  // no such file: no THP for shmem
  const auto d = root.path() / "kernel" / "mm" / "transparent_hugepage";
  std::filesystem::create_directories(d);
  auto policy = [&](const std::string& line) { std::ofstream(d / "shmem_enabled") << line << "\n"; };
  policy("always within_size advise [never] deny force");
  REQUIRE_FALSE(detail::shmem_huge_faults(root.path()));
  policy("always within_size advise never [deny] force");
  REQUIRE_FALSE(detail::shmem_huge_faults(root.path()));
  policy("always within_size [advise] never deny force");
  REQUIRE(detail::shmem_huge_faults(root.path()));
  policy("[always] within_size advise never deny force");
  REQUIRE(detail::shmem_huge_faults(root.path()));
  policy("always within_size advise never deny force");  // no choice marked: as none
  REQUIRE_FALSE(detail::shmem_huge_faults(root.path()));
  policy("always within_size [advise] never deny force");
  balloon(root.path(), "virtio0", reporting);  // a host that takes free memory back
  REQUIRE_FALSE(detail::shmem_huge_faults(root.path()));
}
