#pragma once
/// \file
/// A window of a distributed load in flight: the memory that holds its bytes
/// (`window_buffers`, `lane_window`) and what the stages pass on
/// (`window_state`). Where each rank's bytes lie and which messages carry
/// them is the load's schedule (policy/schedule.hpp), computed once before
/// the windows; the stages that fill, move and deliver a window
/// (read_window.hpp, exchange_window.hpp, deliver_window.hpp) only read it.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <span>
#include <vector>

#include <sluice/comm/concepts.hpp>
#include <sluice/comm/device_lane.hpp>
#include <sluice/core/channel.hpp>
#include <sluice/core/task.hpp>
#include <sluice/memory/lease.hpp>
#include <sluice/memory/window_buffers.hpp>
#include <sluice/policy/plan.hpp>
#include <sluice/policy/schedule.hpp>
#include <sluice/stages/coalesce.hpp>

namespace sluice::inline v0 {

using policy::travels_in;
using policy::window_lane;

}  // namespace sluice::inline v0

namespace sluice::inline v0::detail {

// One lane of a window in flight: this rank's layout of it (the schedule's),
// the memory its bytes occupy and the messages that move them.
struct lane_window {
  window_lane which = window_lane::all;
  lease kept, scratch;          // host memory: this rank's reads land here (and the host lane travels from/to it)
  std::span<std::byte> node;    // this window's parity of the node window (relays receive there)
  lease dev_kept, dev_scratch;  // device lane: its memory (what travels, what the sink sees)
  const policy::rank_layout* layout = nullptr;
  std::vector<std::pair<std::span<std::byte>, std::span<const std::byte>>> uploads;  // (lane memory, host bytes)
  std::vector<comm::send_message> sends;
  std::vector<comm::recv_message> recvs;
  /// The device lane's second step (lane_schedule::second): a relay's
  /// sends to its node's other keepers, after `sends`/`recvs`. `two_steps`:
  /// the window has one on some rank (every rank then takes it).
  std::vector<comm::send_message> sends2;
  std::vector<comm::recv_message> recvs2;
  bool two_steps = false;
  std::uint64_t sent = 0, received = 0, uploaded = 0;
  // A layout region as host memory (where reads land), and as the memory that travels and the sink sees.
  [[nodiscard]] std::span<std::byte> host_at(policy::region at, std::size_t n) const {
    if (at.node) return node.subspan(at.off, n);
    return (at.kept ? kept : scratch).bytes().subspan(at.off, n);
  }
  [[nodiscard]] std::span<std::byte> data_at(policy::region at, std::size_t n) const {
    if (which != window_lane::device || at.node) return host_at(at, n);
    return (at.kept ? dev_kept : dev_scratch).bytes().subspan(at.off, n);
  }
};

// The tensors a rank reads as it delivers them (distributed_options::
// pieces_above): those of at least `above` bytes (0: none) that it gets
// whole through its own source, in pieces of `piece` bytes, `depth` at a
// time (window buffers, kept in reserve with the windows' own).
struct delivery_reads {
  std::uint64_t above = 0;
  std::uint64_t piece = 0;
  std::size_t depth = 1;
};

// What one window cost and carried, counted by the stage that did the work;
// the driver adds them up into distributed_stats once the window is done.
struct window_stats {
  double read_seconds = 0, exchange_seconds = 0, deliver_seconds = 0;
  std::uint64_t fetched = 0;  // tensor bytes this rank read for it
  std::uint64_t taken = 0;    // bytes it read from the node's page cache instead of receiving them (rank_layout::read_at::taken)
  std::uint64_t mapped = 0;   // bytes it keeps that it handed out as views of the page cache (read_window's map_above)
  std::uint64_t delivered_read = 0;  // bytes it keeps that deliver_window read (window_state::at_delivery)
  std::uint64_t node = 0;     // bytes it copied from the node window instead of receiving them (node_copy::window)
  std::uint64_t sent = 0, received = 0, uploaded = 0, messages = 0;
  std::uint64_t status_exchanges = 0;  // 1 if the ranks exchanged their status for it (window_schedule::status)
  std::uint64_t tensors = 0, accepted = 0, owned = 0, placeholders = 0, shared_views = 0, device_views = 0;
  std::uint64_t kept = 0;  // bytes of the tensors (parts) it delivered as its own

  window_stats& operator+=(const window_stats& o) noexcept {
    read_seconds += o.read_seconds, exchange_seconds += o.exchange_seconds, deliver_seconds += o.deliver_seconds;
    fetched += o.fetched, taken += o.taken, mapped += o.mapped, delivered_read += o.delivered_read, node += o.node, sent += o.sent, received += o.received, uploaded += o.uploaded, messages += o.messages;
    status_exchanges += o.status_exchanges;
    tensors += o.tensors, accepted += o.accepted, owned += o.owned, placeholders += o.placeholders;
    shared_views += o.shared_views, device_views += o.device_views, kept += o.kept;
    return *this;
  }
};

// The window pipeline's input and output (read_window | exchange_window |
// deliver_window is a stage from window_ticket to window_ticket). In: the
// window to read, and this rank's failure so far that no status exchange has
// reported yet (a delivery that failed). Out: the window delivered, its
// stats, and this rank's failure that no status exchange has reported yet:
// its delivery's, or its reads' when the window exchanged no status
// (window_schedule::status). A ticket is also the
// window's credit: the driver hands out the next one only when a window
// comes out, so at most `credits` windows (and their buffers) are in flight.
struct window_ticket {
  std::uint32_t window = 0;
  std::exception_ptr failure;
  window_stats stats;
};

// A window as it flows through read_window | exchange_window | deliver_window:
// plan entries [begin, end), one lane_window per lane (one without a device
// lane; host and device with one), where this rank's part of each entry it
// owns lies, and the window's own status and stats. `failure`: this rank's
// failure, as of this window (a read of it, or an earlier delivery), which
// the window's status exchange reports to every rank; a failed window
// carries no layout (its exchange ends the load).
struct window_state {
  std::uint32_t window = 0;
  std::size_t begin = 0, end = 0;
  std::vector<lane_window> lanes;
  std::vector<std::span<std::byte>> kept_at;  // by entry (i - begin): this rank's part of the tensor
  std::vector<lease> views;                   // by entry: the page-cache view kept_at lies in, if mapped (else the lane's kept)
  std::vector<std::uint8_t> lane_of;          // by entry: its lane (index into lanes)
  // By entry: this rank's reads of its part, in file order and covering it,
  // which deliver_window makes as it delivers it (distributed_options::
  // pieces_above: into the sink's destination, or in pieces); empty: its
  // part lies in the window (kept_at).
  std::vector<std::vector<byte_extent>> at_delivery;
  // node_copy::window: (where in this rank's memory, from the node window),
  // copied by exchange_window after the status exchange; then, `cut_later`,
  // it cuts column parts and lists uploads (read_window did not).
  std::vector<std::pair<std::span<std::byte>, std::span<const std::byte>>> node_copies;
  bool cut_later = false;
  bool relayed = false;  // window_schedule::relayed: a barrier, then each lane's copies (rank_layout::copies)
  bool status = true;    // window_schedule::status: the ranks exchange their status before its exchange
  std::exception_ptr failure;
  window_stats stats;
};

// The order of the node window's parities when windows overlap (read w + 1
// while w travels): window w lands in parity w % P (memory::node_window),
// which window w - P used. Every local rank has copied window w - P out
// once it has entered window w - P + 1's status exchange (it copies a
// window before it takes the next one's status), so this rank may read
// window w into its parity once that exchange is done here: exchange_window
// opens window w + P - 1 after window w's status exchange (open), and
// read_window waits for it before reading window w >= P (wait). With P = 2,
// a rank reads window w + 1 only once every rank has read window w - 1;
// with P = 3 (the driver's choice when overlapped) the gate's condition is
// the window credits' own (window w - 2 delivered here), so it never holds a
// read back and a rank may run a window ahead of the slowest, as over Gloo.
// Serial windows need no gate: each is copied before the next is read.
// Strand-confined, as its channel; a failed exchange aborts it (abort), so a
// read waiting on it stops too.
class parity_gate {
 public:
  parity_gate(std::uint32_t windows, std::uint32_t parities)
      : opened_(std::size_t{windows} + parities), parities_(parities), open_through_(parities - 1) {}
  /// After window w's status exchange.
  [[nodiscard]] task<void> open_after(std::uint32_t w) { return opened_.send(w + parities_ - 1); }
  /// Before reading window w.
  [[nodiscard]] task<void> wait(std::uint32_t w) {
    while (w >= parities_ && open_through_ < w) {
      auto next = co_await opened_.receive();
      if (!next) co_return;  // closed: the exchange stage has ended, nothing more travels
      open_through_ = *next;
    }
  }
  void close() noexcept { opened_.close(); }
  void abort(std::exception_ptr e) noexcept { opened_.abort(e); }

 private:
  channel<std::uint32_t> opened_;
  std::uint32_t parities_;
  std::uint32_t open_through_;  // windows up to this one may be read
};

}  // namespace sluice::inline v0::detail
