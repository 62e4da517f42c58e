// Reads a staging slot after its lease was released. Under ASan this must be
// reported (use-after-poison); without ASan the poison bytes must be visible.
#include <cstdio>

#include <sluice/memory/staging_pool.hpp>

int main() {
  sluice::staging_pool pool({.budget = 1 << 20, .slot_size = 1 << 20, .poison = true});
  auto l = *pool.try_acquire();
  volatile const std::byte* stale = l.bytes().data();  // what a model that kept a bare view would hold
  l.reset();
  const auto b = static_cast<unsigned>(stale[100]);
  if (b == 0xdb) std::printf("read poison bytes 0xdb after release\n");
  return 0;
}
