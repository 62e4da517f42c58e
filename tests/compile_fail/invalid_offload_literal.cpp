// An offload literal is parsed at compile time by the run-time parser: one
// that names no strategy must not compile.
#include <sluice/distributed.hpp>

int main() {
  auto ck = sluice::checkpoint::open("/nonexistent");
  (void)sluice::plan_for(ck, "tp1,dp8,ep8", "per_rank");
}
