// A topology literal is parsed at compile time by the run-time parser: one
// whose EP does not divide TP*DP must not compile.
#include <sluice/distributed.hpp>

int main() {
  auto ck = sluice::checkpoint::open("/nonexistent");
  (void)sluice::plan_for(ck, "tp1,dp8,ep3", "none");
}
