#pragma once
/// \file
/// deliver_window: window_state → window number. The place step of a
/// distributed load: calls the sink for every tensor of the window, in plan
/// order, the same calls on every rank — owners get their bytes
/// (`view_kind::bytes`, or `view_kind::device` with a device lane; under
/// TP > 1 their part, `tensor_view::part` saying which), non-owners a
/// `view_kind::placeholder` view (unless `placeholders` is off), every
/// local rank a `view_kind::shared` view of a shared table. Then it releases
/// the window and gives its credit back. A sink that throws does not stop
/// the stage: the failure is recorded and reported to the peers by the next
/// status exchange, and from then on (as after any failure of this rank) the
/// sink is not called again.

#include <chrono>
#include <cstdint>
#include <exception>
#include <variant>

#include <sluice/comm/device_lane.hpp>
#include <sluice/core/channel.hpp>
#include <sluice/core/lease.hpp>
#include <sluice/core/task.hpp>
#include <sluice/distributed/fault.hpp>
#include <sluice/distributed/load_context.hpp>
#include <sluice/distributed/window.hpp>
#include <sluice/stages/concepts.hpp>
#include <sluice/tensor_view.hpp>

namespace sluice::inline v0::detail {

template <device_lane Lane>
class deliver_window : public pipeable {
 public:
  using input_type = window_state;
  using output_type = std::uint32_t;  ///< the window delivered

  explicit deliver_window(load_context<Lane>& ctx) : ctx_(&ctx) {}

  [[nodiscard]] task<void> run(channel<input_type>& in, channel<output_type>& out) {
    for (;;) {
      auto ws = co_await in.receive();
      if (!ws) break;
      const auto w = ws->window;
      deliver(*ws);
      ws.reset();  // the window's buffers, before read_window reuses them
      co_await ctx_->credits.send({});
      co_await out.send(w);
    }
  }

 private:
  void deliver(const window_state& ws) {
    auto& c = *ctx_;
    const auto& plan = c.plan;
    auto& st = c.st;
    fault_point("delivery", c.me);
    if (c.failure) return;  // the load fails at the next status exchange: the sink is not called again
    const auto d0 = std::chrono::steady_clock::now();
    try {
      for (std::size_t i = ws.begin; i < ws.end; ++i) {
        const auto& e = plan.entries[i];
        tensor_view v;
        v.tensor = &c.ck.tensors()[e.index];
        if (e.shared()) {
          v.kind = view_kind::shared;
          v.bytes = c.segment.bytes().subspan(e.shared_offset, e.info.size);
          v.hold = lease(c.segment.keep(), c.segment.bytes());  // the whole segment: a sink registers it once
          v.host_destined = true;
          st.shared_views += 1;
        } else if (e.owners.contains(c.me)) {
          const auto& L = ws.lanes[ws.lane_of[i - ws.begin]];
          const bool dev = L.which == window_lane::device;
          v.kind = dev ? view_kind::device : view_kind::bytes;
          v.bytes = ws.kept_at[i - ws.begin];
          v.hold = dev ? L.dev_kept : L.kept;
          v.host_destined = e.owner_destination == policy::destination::host;
          if (e.split != policy::tp_split::none)
            v.part = {e.split == policy::tp_split::rows ? 0u : 1u, static_cast<std::uint32_t>(plan.tp_rank(c.me)),
                      static_cast<std::uint32_t>(plan.tp)};
          st.owned += 1;
          st.device_views += dev ? 1 : 0;
        } else if (c.opt.placeholders) {
          v.kind = view_kind::placeholder;
          st.placeholders += 1;
        } else {
          continue;
        }
        st.tensors += 1;
        st.accepted += c.sink.accept(std::move(v)) ? 1 : 0;
      }
    } catch (...) {
      c.fail(std::current_exception());
    }
    st.deliver_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - d0).count();
  }

  load_context<Lane>* ctx_;
};

}  // namespace sluice::inline v0::detail
