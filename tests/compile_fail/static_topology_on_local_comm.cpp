// A plan for a static topology of 8 ranks cannot run on comm::local, whose
// type says its world is one rank: the mismatch is a compile error, not a
// run-time one.
#include <sluice/distributed.hpp>
#include <sluice/sink/digest_sink.hpp>

int main() {
  auto ck = sluice::checkpoint::open("/nonexistent");
  sluice::comm::local c;
  const auto plan = sluice::plan_for(ck, sluice::policy::tp1_dp8_ep8{}, sluice::policy::offload::none{});
  sluice::digest_sink s;
  (void)sluice::load_distributed(ck, c, plan, s);
}
