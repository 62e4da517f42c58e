// A distributed load with a device lane into a host-only sink must not
// compile: the lane delivers view_kind::device views, which digest_sink
// cannot read.
#include <sluice/distributed.hpp>
#include <sluice/sink/digest_sink.hpp>

namespace {
struct some_lane {
  sluice::lease host_buffer(unsigned, std::size_t) { return {}; }
  sluice::lease device_buffer(unsigned, std::size_t) { return {}; }
  void upload(std::span<std::byte>, std::span<const std::byte>) {}
  void exchange(std::span<const sluice::comm::send_message>, std::span<const sluice::comm::recv_message>) {}
};
}  // namespace

int main() {
  auto ck = sluice::checkpoint::open("/nonexistent");
  sluice::comm::local c;
  const auto plan = sluice::plan_for(ck, "tp1,dp1,ep1", "none");
  sluice::digest_sink s;
  some_lane lane;
  (void)sluice::load_distributed(ck, c, plan, s, {}, lane);
}
