#pragma once
/// \file
/// `admission`: a gate `fetch` asks before it issues each read request, for a
/// consumer that bounds what a load may run ahead of it (tensor_stream: the
/// bytes read but not yet handed out). It may also give a request a direct
/// destination (memory of the consumer's own for a tensor larger than a slot),
/// chosen only now, when the read is about to be issued, rather than when the
/// load was planned: memory then exists only for the reads the gate let in.
///
/// Protocol (fetch's side): requests are asked in file order. `try_admit`
/// answers at once; when it declines, fetch first delivers every read it has
/// finished (they hold memory only downstream can release) and then awaits
/// `admit`, which suspends until the request may go. Both may set
/// `req.direct` (then fetch reads into it and takes no slot). The gate is
/// released from other threads (the consumer); `admit` must resume the
/// awaiting coroutine through its own executor (detail::waiter_queue does).

#include <sluice/core/task.hpp>
#include <sluice/stages/coalesce.hpp>

namespace sluice::inline v0 {

class admission {
 public:
  virtual ~admission() = default;
  /// Admits `req` now (true) or declines without waiting (false).
  [[nodiscard]] virtual bool try_admit(read_request& req) = 0;
  /// Suspends until `req` is admitted. Throws cancelled_error when the
  /// consumer stopped, or the consumer's error.
  [[nodiscard]] virtual task<void> admit(read_request& req) = 0;
};

}  // namespace sluice::inline v0
