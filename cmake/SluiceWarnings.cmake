# Warnings for sluice's own targets (tests, examples, benches, compiled parts),
# linked PRIVATE; never global flags, never imposed on consumers.
add_library(sluice_warnings INTERFACE)
target_compile_options(sluice_warnings INTERFACE
  $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra -Wpedantic -Wshadow=local -Wnon-virtual-dtor -Wno-missing-field-initializers>
  # GCC 12 inlines Asio 1.18's awaitable frame operator new/delete (a recycling
  # allocator) and then reports them as mismatched: a false positive.
  $<$<CXX_COMPILER_ID:GNU>:-Wno-mismatched-new-delete>)
