// Must not compile: EP=3 does not divide a TP1 x DP8 world.
#include <sluice/policy/topology.hpp>

int main() {
  sluice::policy::topology<1, 8, 3> t;
  return static_cast<int>(t.world_size());
}
