// memory::anonymous_memory (memory/recycler.hpp): a mapping per buffer.

#include <sluice/memory/recycler.hpp>

#include <sys/mman.h>

#include <fmt/format.h>

#include <sluice/error.hpp>

namespace sluice::inline v0::memory {

namespace {
constexpr std::size_t huge_page = std::size_t{2} << 20;
std::size_t alignment_for(std::size_t n) { return n >= huge_page ? huge_page : 4096; }
}  // namespace

std::size_t anonymous_memory::capacity_for(std::size_t n) const noexcept {
  const auto a = alignment_for(n);
  return n == 0 ? 4096 : (n + a - 1) / a * a;
}

void* anonymous_memory::allocate(std::size_t cap) const {
  const std::size_t align = alignment_for(cap);
  const std::size_t extra = align > 4096 ? align : 0;
  void* m = ::mmap(nullptr, cap + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) throw resource_error(fmt::format("cannot map a buffer of {} bytes", cap));
  auto* base = static_cast<std::byte*>(m);
  auto* p = base + (align - reinterpret_cast<std::uintptr_t>(base) % align) % align;
  if (extra) {  // keep the aligned part only
    if (p > base) ::munmap(base, static_cast<std::size_t>(p - base));
    if (const auto tail = static_cast<std::size_t>(base + cap + extra - (p + cap))) ::munmap(p + cap, tail);
    ::madvise(p, cap, MADV_HUGEPAGE);  // a hint: first touch then faults 2 MiB at a time
  }
  return p;
}

void anonymous_memory::free(void* p, std::size_t cap) const noexcept { ::munmap(p, cap); }

}  // namespace sluice::inline v0::memory
