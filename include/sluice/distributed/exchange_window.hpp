#pragma once
/// \file
/// exchange_window: window_state → window_state. The exchange step of a
/// distributed load: each slice goes from the rank that read it to the ranks
/// that keep it, and to no other (point-to-point messages over the host
/// communicator; device-lane bytes are uploaded first and travel over the
/// lane). Before a window's messages, the ranks exchange their status
/// (peers.hpp), the one the window carries (window_state::failure): a rank
/// whose reads or deliveries failed makes every rank throw distributed_error
/// naming it, at the same point. A window with no message on any rank does
/// so only where the schedule says (window_schedule::status: every
/// status_every bytes, and the last); otherwise it asks only whether a peer
/// died (the communicator's liveness signal) and calls no host exchange.
/// That error, as a lost peer's, is the pipeline's: it leaves this stage as
/// an exception, which aborts the pipeline's channels and so stops every
/// other stage.
///
/// Where cores allow (distributed_options::overlap), the status exchange and
/// the messages run on one long-lived thread of the stage's own, so the
/// driver's thread reads the next window meanwhile; otherwise they run
/// inline. Either way only one thread uses the communicator at a time, and
/// the lane's upload / exchange are called from that thread (see
/// device_lane). The window itself stays owned by this stage's coroutine on
/// the driver's thread; the exchange thread works on it while the coroutine
/// waits. Compiled once, in the driver (src/core/driver.cpp), over an
/// erased communicator and lane.

#include <chrono>
#include <cstring>
#include <cstdint>
#include <functional>
#include <string>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <sluice/comm/any_communicator.hpp>
#include <sluice/comm/device_lane.hpp>
#include <sluice/core/channel.hpp>
#include <sluice/core/task.hpp>
#include <sluice/distributed/fault.hpp>
#include <sluice/distributed/peers.hpp>
#include <sluice/distributed/read_window.hpp>
#include <sluice/distributed/window.hpp>
#include <sluice/stages/concepts.hpp>

namespace sluice::inline v0::detail {

class exchange_window : public pipeable {
 public:
  using input_type = window_state;
  using output_type = window_state;

  /// `lane`: the load's device lane (null: none); `windows`: the plan's
  /// window count (for phase names); `thread`: where the exchange runs
  /// (null: inline, on the driver's thread); `gate`: where windows overlap
  /// through the node window, its parity_gate (window.hpp), opened after
  /// each window's status exchange.
  exchange_window(comm::any_communicator& c, const policy::load_plan& plan, any_device_lane* lane, std::uint32_t windows,
                  asio::thread_pool* thread, parity_gate* gate = nullptr)
      : c_(&c), plan_(&plan), lane_(lane), windows_(windows), thread_(thread), gate_(gate), liveness_(c.liveness()) {}

  [[nodiscard]] task<void> run(channel<input_type>& in, channel<output_type>& out) {
    try {
      co_await each_window(in, out);
    } catch (...) {
      if (gate_) gate_->abort(std::current_exception());  // a read waiting on it stops too
      throw;
    }
    if (gate_) gate_->close();
  }

 private:
  task<void> each_window(channel<input_type>& in, channel<output_type>& out) {
    for (;;) {
      auto ws = co_await in.receive();
      if (!ws) break;
      double seconds = 0;
      if (thread_) {
        // The status exchange, then (through the node window) the gate
        // opens the parity it freed, on this strand, then the copies and
        // messages.
        const bool moves = co_await asio::co_spawn(*thread_, on_thread_check(&*ws), asio::use_awaitable);
        if (gate_) co_await gate_->open_after(ws->window);
        if (moves) seconds = co_await asio::co_spawn(*thread_, on_thread_move(&*ws), asio::use_awaitable);
      } else {
        seconds = check(*ws) ? move(*ws) : 0;
      }
      ws->stats.exchange_seconds = seconds;
      for (const auto& L : ws->lanes) {
        ws->stats.sent += L.sent;
        ws->stats.received += L.received;
        ws->stats.uploaded += L.uploaded;
        ws->stats.messages += L.sends.size() + L.recvs.size() + L.sends2.size() + L.recvs2.size();
      }
      co_await out.send(std::move(*ws));
    }
  }

  task<bool> on_thread_check(window_state* ws) { co_return check(*ws); }
  task<double> on_thread_move(window_state* ws) { co_return move(*ws); }

  // The status exchange (where the schedule has one: window_schedule::status);
  // returns whether the window moves (move). A window without one carries
  // its failure on to the next that has (its ticket, then the next window's
  // reads), and only asks whether a peer died (the communicator's liveness
  // signal, no collective). The status exchange reports the windows read
  // since the last one.
  bool check(window_state& ws) {
    const auto phase = first_unchecked_ == ws.window
                           ? fmt::format("reading window {} of {}", ws.window + 1, windows_)
                           : fmt::format("reading windows {}-{} of {}", first_unchecked_ + 1, ws.window + 1, windows_);
    if (ws.status) {
      check_peers(*c_, ws.failure, phase);
      first_unchecked_ = ws.window + 1;
      ws.stats.status_exchanges = 1;
    } else {
      if (liveness_) in_phase(phase, liveness_);
      if (ws.failure) return false;  // a failed window has no layout: the next status exchange reports it
    }
    return true;
  }

  // The window's copies out of the node window and its messages; returns their seconds.
  double move(window_state& ws) {
    const auto x0 = std::chrono::steady_clock::now();
    // Every rank has read the window: what lies in the node window is there
    // to copy (node_copy::window). Nothing writes this parity of it again
    // before every local rank has copied: serial windows read window w + 2
    // after window w + 1's status exchange, overlapped ones as the
    // parity_gate says.
    if (!ws.node_copies.empty()) fault_point("node copies", c_->rank());
    for (const auto& [dst, src] : ws.node_copies) std::memcpy(dst.data(), src.data(), src.size());
    if (ws.cut_later)
      for (auto& L : ws.lanes) cut_and_list_uploads(*plan_, L);
    in_phase(fmt::format("exchanging window {} of {}", ws.window + 1, windows_), [&] {
      for (auto& L : ws.lanes) {
        if (L.which != window_lane::device) {
          // A window without a status exchange has no message on any rank
          // (window_schedule::status): every rank leaves the exchange out
          // alike (the communicator numbers its exchanges).
          if (ws.status) c_->exchange(L.sends, L.recvs);
          continue;
        }
        for (const auto& [dst, src] : L.uploads) lane_->upload(dst, src);
        lane_->exchange(L.sends, L.recvs);
        // Relayed device bytes: each node's relay received them from another
        // node just now, and sends them on to the node's other keepers.
        if (L.two_steps) lane_->exchange(L.sends2, L.recvs2);
      }
      // Bytes from other nodes that a relay of this node received into the
      // node window: once every relay has (a barrier: every rank, since the
      // window's schedule says so on every rank), each keeper copies its own.
      if (ws.relayed) {
        c_->barrier();
        for (auto& L : ws.lanes)
          for (const auto& cp : L.layout->copies) {
            std::memcpy(L.host_at(cp.to, cp.size).data(), L.node.subspan(cp.from, cp.size).data(), cp.size);
            ws.stats.node += cp.size;
          }
      }
    });
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - x0).count();
  }

  comm::any_communicator* c_;
  const policy::load_plan* plan_;
  any_device_lane* lane_;  // null: no device lane (no window has a device lane then)
  std::uint32_t windows_;
  asio::thread_pool* thread_;
  parity_gate* gate_;  // null: serial windows, or no node window
  std::function<void()> liveness_;   // comm::any_communicator::liveness(): empty where it has none
  std::uint32_t first_unchecked_ = 0;  // the first window read since the last status exchange
};

}  // namespace sluice::inline v0::detail
