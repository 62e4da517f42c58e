#pragma once
/// \file
/// place: tensor views → the sink. Emits one `placement` per view, recording
/// whether the sink accepted it (the input of the loader's bookkeeping:
/// load_async's counts and progress).

#include <chrono>
#include <cstdint>
#include <memory>

#include <sluice/core/channel.hpp>
#include <sluice/core/task.hpp>
#include <sluice/sink/concepts.hpp>
#include <sluice/stages/concepts.hpp>
#include <sluice/stages/fetch.hpp>
#include <sluice/tensor_view.hpp>

namespace sluice::inline v0 {

/// What happened to one view.
struct placement {
  const tensor_ref* tensor = nullptr;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  bool last = false;       ///< the tensor's last piece
  bool accepted = false;   ///< false: the sink declined
};

template <sink Sink>
class place : public pipeable {
 public:
  using input_type = tensor_view;
  using output_type = placement;

  explicit place(Sink& s) : sink_(&s) {}

  [[nodiscard]] const step_counters& counters() const noexcept { return *counters_; }

  [[nodiscard]] task<void> run(channel<input_type>& in, channel<output_type>& out) {
    while (auto v = co_await in.receive()) {
      placement p{v->tensor, v->offset, v->bytes.size(), v->last(), false};
      const auto t0 = std::chrono::steady_clock::now();
      p.accepted = sink_->accept(std::move(*v));
      v.reset();  // release the lease before waiting on the next stage
      counters_->busy_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      counters_->items += 1;
      counters_->bytes += p.bytes;
      co_await out.send(p);
    }
  }

 private:
  Sink* sink_;
  std::shared_ptr<step_counters> counters_ = std::make_shared<step_counters>();
};

}  // namespace sluice::inline v0
