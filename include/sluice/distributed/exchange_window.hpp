#pragma once
/// \file
/// exchange_window: window_state → window_state. The exchange step of a
/// distributed load: each slice goes from the rank that read it to the ranks
/// that keep it, and to no other (point-to-point messages over the host
/// communicator; device-lane bytes are uploaded first and travel over the
/// lane). Before each window's messages, the ranks exchange their status
/// (peers.hpp): a rank whose reads or deliveries failed makes every rank
/// throw distributed_error naming it, at the same point.
///
/// Where cores allow (distributed_options::overlap), the status exchange and
/// the messages run on one long-lived thread of the stage's own, so the
/// driver's thread reads the next window meanwhile; otherwise they run
/// inline. Either way only one thread uses the communicator at a time.

#include <chrono>
#include <exception>
#include <string>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <sluice/comm/concepts.hpp>
#include <sluice/comm/device_lane.hpp>
#include <sluice/core/channel.hpp>
#include <sluice/core/task.hpp>
#include <sluice/distributed/load_context.hpp>
#include <sluice/distributed/peers.hpp>
#include <sluice/distributed/window.hpp>
#include <sluice/stages/concepts.hpp>

namespace sluice::inline v0::detail {

template <comm::communicator Comm, device_lane Lane>
class exchange_window : public pipeable {
 public:
  using input_type = window_state;
  using output_type = window_state;

  /// `thread`: where the exchange runs (null: inline, on the driver's thread).
  exchange_window(load_context<Lane>& ctx, Comm& c, asio::thread_pool* thread) : ctx_(&ctx), c_(&c), thread_(thread) {}

  [[nodiscard]] task<void> run(channel<input_type>& in, channel<output_type>& out) {
    for (;;) {
      auto ws = co_await in.receive();
      if (!ws) break;
      // This rank's failures so far travel in the status exchange; the
      // context itself stays on the driver's thread.
      const auto failure = ctx_->failure;
      const auto phase = fmt::format("reading window {} of {}", ws->window + 1, ctx_->plan.windows);
      double seconds = 0;
      std::exception_ptr broken;
      try {
        if (thread_)
          seconds = co_await asio::co_spawn(*thread_, on_thread(&*ws, failure, phase), asio::use_awaitable);
        else
          seconds = travel(*ws, failure, phase);
      } catch (...) {
        broken = std::current_exception();
      }
      if (broken) {
        ctx_->credits.abort(broken);  // read_window may wait for a credit that will not come
        std::rethrow_exception(broken);
      }
      auto& st = ctx_->st;
      st.exchange_seconds += seconds;
      for (const auto& L : ws->lanes) {
        st.bytes_sent += L.sent;
        st.bytes_received += L.received;
        st.bytes_uploaded += L.uploaded;
        st.messages += L.sends.size() + L.recvs.size();
      }
      co_await out.send(std::move(*ws));
    }
  }

 private:
  task<double> on_thread(window_state* ws, std::exception_ptr failure, std::string phase) {
    co_return travel(*ws, std::move(failure), phase);
  }

  // The status exchange, then the window's messages; returns their seconds.
  double travel(window_state& ws, std::exception_ptr failure, const std::string& phase) {
    check_peers(*c_, failure, phase);
    const auto x0 = std::chrono::steady_clock::now();
    in_phase(fmt::format("exchanging window {} of {}", ws.window + 1, ctx_->plan.windows), [&] {
      for (auto& L : ws.lanes) {
        if (L.which != window_lane::device) {
          c_->exchange(L.sends, L.recvs);
          continue;
        }
        for (const auto& [dst, src] : L.uploads) ctx_->lane.upload(dst, src);
        ctx_->lane.exchange(L.sends, L.recvs);
      }
    });
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - x0).count();
  }

  load_context<Lane>* ctx_;
  Comm* c_;
  asio::thread_pool* thread_;
};

}  // namespace sluice::inline v0::detail
