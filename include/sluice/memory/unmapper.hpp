#pragma once
/// \file
/// `unmap_later`: munmap on a thread of its own. Tearing down the page
/// tables of a large populated mapping (a shard's page-cache views, once the
/// last view of it is dropped) takes tens of milliseconds per GiB, which
/// would otherwise land on whichever thread drops that last view: an
/// engine's loop over the tensors (bench/README.md, page-cache views).

#include <cstddef>

namespace sluice::inline v0 {

/// Unmaps [addr, addr + length) soon, on the process's unmapping thread
/// (started at the first call, and again in a child forked since). Never
/// blocks on the unmapping; falls back to munmap on the calling thread if the
/// thread cannot be started. The range must not be used after the call.
void unmap_later(void* addr, std::size_t length) noexcept;

}  // namespace sluice::inline v0
