#pragma once
/// \file
/// read_window: window number → window_state. The first stage of a
/// distributed load's window pipeline (read_window | exchange_window |
/// deliver_window). For each window it takes a credit (a free set of window
/// buffers), takes this rank's layout of it from the schedule
/// (policy/schedule.hpp), reads this rank's planned
/// slices through the reader (coalesce | fetch | stage | place, into the
/// window's host memory), cuts column parts, and lists the device lane's
/// uploads. A read failure does not throw: it is recorded in the context and
/// reported to the peers by the next status exchange, so that every rank
/// stops at the same point.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <sluice/comm/device_lane.hpp>
#include <sluice/core/channel.hpp>
#include <sluice/core/task.hpp>
#include <sluice/distributed/fault.hpp>
#include <sluice/distributed/load_context.hpp>
#include <sluice/distributed/window.hpp>
#include <sluice/stages/concepts.hpp>

namespace sluice::inline v0::detail {

template <device_lane Lane>
class read_window : public pipeable {
 public:
  using input_type = std::uint32_t;  ///< window number, in plan order
  using output_type = window_state;

  explicit read_window(load_context<Lane>& ctx) : ctx_(&ctx) {}

  [[nodiscard]] task<void> run(channel<input_type>& in, channel<output_type>& out) {
    auto ex = co_await this_executor;
    for (;;) {
      const auto w = co_await in.receive();
      if (!w) break;
      (void)co_await ctx_->credits.receive();
      co_await out.send(read(*w));
      // Let the exchange stage hand window w to its thread before this
      // thread reads window w+1 (otherwise nothing would overlap).
      co_await asio::post(ex, asio::use_awaitable);
    }
  }

 private:
  window_state read(std::uint32_t w) {
    using clock = std::chrono::steady_clock;
    auto& c = *ctx_;
    const auto& plan = c.plan;
    const auto me = c.me;
    fault_point("reads", me);
    window_state ws;
    ws.window = w;
    ws.begin = c.schedule.windows.at(w).begin;
    ws.end = c.schedule.windows.at(w).end;
    ws.kept_at.resize(ws.end - ws.begin);
    ws.lane_of.assign(ws.end - ws.begin, 0);
    const auto r0 = clock::now();
    try {
      constexpr bool with_lane = !std::is_same_v<Lane, no_device_lane>;
      if constexpr (with_lane) {
        ws.lanes.resize(2);
        ws.lanes[0].which = window_lane::host;
        ws.lanes[1].which = window_lane::device;
      } else {
        ws.lanes.resize(1);
      }
      // The schedule's layouts of this window (one per lane): their offsets
      // become spans of this window's buffers (host memory for the reads;
      // for the device lane, also its memory).
      const auto& sched = c.schedule.windows.at(w);
      planned_reads reads;
      for (std::uint8_t k = 0; k < ws.lanes.size(); ++k) {
        auto& L = ws.lanes[k];
        const bool dev = L.which == window_lane::device;
        const auto& scheduled = sched.lanes.at(k);
        const auto& lay = scheduled.ranks.at(me);
        L.layout = &lay;
        const unsigned slot = (w % 2) * 2;
        L.kept = dev ? c.lane.host_buffer(slot, lay.kept_bytes) : c.buffers.at(w % 2, 0).get(lay.kept_bytes);
        L.scratch = dev ? c.lane.host_buffer(slot + 1, lay.scratch_bytes) : c.buffers.at(w % 2, 1).get(lay.scratch_bytes);
        if (dev) {
          L.dev_kept = c.lane.device_buffer(slot, lay.kept_bytes);
          L.dev_scratch = c.lane.device_buffer(slot + 1, lay.scratch_bytes);
        }
        for (const auto& part : lay.kept) {
          ws.kept_at[part.entry - ws.begin] = L.data_at({true, part.off}, plan.kept_bytes(plan.entries[part.entry]));
          ws.lane_of[part.entry - ws.begin] = k;
        }
        for (auto i : lay.sends) {
          const auto& m = scheduled.messages[i];
          L.sends.push_back({m.to, m.tag, L.data_at(m.src, m.size)}), L.sent += m.size;
        }
        for (auto i : lay.recvs) {
          const auto& m = scheduled.messages[i];
          L.recvs.push_back({m.from, m.tag, L.data_at(m.dst, m.size)}), L.received += m.size;
        }
        for (const auto& r : lay.reads) {
          const auto& e = plan.entries[r.entry];
          const auto& rd = e.reads[r.read];
          reads.push_back({&c.ck.tensors()[e.index], rd.offset, rd.size, L.host_at(r.at, rd.size)});
          // What a device-lane rank read travels or stays as read, except the
          // whole rows of a column split: its cut parts do.
          if (dev && rd.size && e.split != policy::tp_split::columns)
            L.uploads.emplace_back(L.data_at(r.at, rd.size), L.host_at(r.at, rd.size));
        }
      }
      c.read(reads);  // one batch for every lane: adjacent slices still coalesce
      for (auto& L : ws.lanes) cut_and_list_uploads(L);
    } catch (...) {
      c.fail(std::current_exception());
    }
    c.st.read_seconds += std::chrono::duration<double>(clock::now() - r0).count();
    return ws;
  }

  // Column-split tensors: cuts each TP part out of the rows this rank read;
  // then merges adjacent uploads into one copy.
  void cut_and_list_uploads(lane_window& L) const {
    const auto& plan = ctx_->plan;
    const bool dev = L.which == window_lane::device;
    const auto& mine = L.layout->reads;
    for (const auto& cut : L.layout->cuts) {
      const auto& e = plan.entries[mine[cut.from].entry];
      const auto& rd = e.reads[mine[cut.from].read];
      const auto row = policy::load_plan::row_bytes(e), part = row / plan.tp, rows = rd.size / row;
      const std::byte* src = L.host_at(mine[cut.from].at, rd.size).data();
      auto dst = L.host_at(cut.at, rows * part);
      for (std::uint64_t j = 0; j < rows; ++j) std::memcpy(dst.data() + j * part, src + j * row + cut.part * part, part);
      if (dev) L.uploads.emplace_back(L.data_at(cut.at, rows * part), dst);
    }
    std::sort(L.uploads.begin(), L.uploads.end(), [](const auto& a, const auto& b) { return a.first.data() < b.first.data(); });
    std::size_t n = 0;
    for (const auto& u : L.uploads) {
      auto& prev = L.uploads[n ? n - 1 : 0];
      if (n && prev.first.data() + prev.first.size() == u.first.data() &&
          prev.second.data() + prev.second.size() == u.second.data())
        prev = {{prev.first.data(), prev.first.size() + u.first.size()}, {prev.second.data(), prev.second.size() + u.second.size()}};
      else
        L.uploads[n++] = u;
    }
    L.uploads.resize(n);
    for (const auto& u : L.uploads) L.uploaded += u.first.size();
  }

  load_context<Lane>* ctx_;
};

}  // namespace sluice::inline v0::detail
