// A forwarding wrapper has its inner sink's traits by default: wrapping a
// host-only sink does not make it take a device lane's views, so a load with
// a lane into it must not compile (as for the host sink itself).
#include <sluice/distributed.hpp>
#include <sluice/sink/digest_sink.hpp>
#include <sluice/sink/forwarding_sink.hpp>

namespace {
struct some_lane {
  sluice::lease host_buffer(unsigned, std::size_t) { return {}; }
  sluice::lease device_buffer(unsigned, std::size_t) { return {}; }
  void upload(std::span<std::byte>, std::span<const std::byte>) {}
  void exchange(std::span<const sluice::comm::send_message>, std::span<const sluice::comm::recv_message>) {}
};
struct counting : sluice::forwarding_sink<sluice::digest_sink> {
  using forwarding_sink::forwarding_sink;
  int n = 0;
  bool accept(sluice::tensor_view v) { ++n; return forwarding_sink::accept(std::move(v)); }
};
}  // namespace

int main() {
  auto ck = sluice::checkpoint::open("/nonexistent");
  sluice::comm::local c;
  const auto plan = sluice::plan_for(ck, "tp1,dp1,ep1", "none");
  sluice::digest_sink inner;
  counting s(inner);
  some_lane lane;
  (void)sluice::load_distributed(ck, c, plan, s, {}, lane);
}
