#pragma once
/// \file
/// Whether a file's mapping asks the kernel for huge pages (`MADV_HUGEPAGE`).
///
/// Asked, the page cache fills in 2 MiB folios, which every later view maps
/// with one page-table entry instead of 512: hot loads after such a fill are
/// faster for every reader (bench/README.md). The exception is a VM whose
/// free memory the host takes back (virtio-balloon free page reporting, of
/// 2 MiB blocks and up): there a 2 MiB folio comes from a block the host
/// has discarded, and the first touch of each of its 4 KiB pages traps to
/// the host, so a cold load after another program freed its memory took
/// 2-2.7x as long (bench/folio_trap.c shows it with no loader). Small folios
/// come from recently freed pages, which the host still backs.

#include <filesystem>

namespace sluice::inline v0 {

/// Whether a virtio balloon device of this machine reports free memory to
/// its host: the feature VIRTIO_BALLOON_F_REPORTING (bit 5) negotiated, as
/// `<sys>/bus/virtio/drivers/virtio_balloon/virtio*/features` lists it (one
/// '0' or '1' per feature bit). False where there is no such device.
[[nodiscard]] bool reports_free_memory(const std::filesystem::path& sys = "/sys");

/// Whether file mappings ask for huge pages, decided once per process:
/// `SLUICE_FILE_HUGEPAGES=on` or `off` decides; unset, empty or `auto`,
/// they do unless reports_free_memory(). Any other value throws
/// config_error naming the variable.
[[nodiscard]] bool file_mapping_huge_pages();

/// Whether a fault in a shared-memory mapping that asks for huge pages
/// (the node's shared segment: memory/shared_host.hpp) takes a 2 MiB page,
/// decided once per process: the system's policy for shmem
/// (`<sys>/kernel/mm/transparent_hugepage/shmem_enabled`) is anything but
/// `never` or `deny` (always, within_size, advise, force), and the machine
/// does not report free memory (there a 2 MiB page traps to the host at each
/// 4 KiB first touch, as for file mappings). Where it does not, the segment's
/// writers write its pages (pwrite: no zeroing, no fault) rather than fault
/// them in; where it does, a fault zeroes and maps 2 MiB at once, which costs
/// less than writing 4 KiB pages (bench/HISTORY.md, the shared segment in
/// pieces).
[[nodiscard]] bool shmem_huge_faults();

namespace detail {
/// shmem_huge_faults's rule for a given sysfs tree: what the tests call.
[[nodiscard]] bool shmem_huge_faults(const std::filesystem::path& sys);
/// file_mapping_huge_pages's rule, for a given value of the variable (null:
/// unset) and machine: what the tests call.
[[nodiscard]] bool file_mapping_huge_pages(const char* setting, const std::filesystem::path& sys);
}  // namespace detail

}  // namespace sluice::inline v0
