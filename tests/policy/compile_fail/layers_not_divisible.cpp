// Must not compile: PP=2 does not divide 61 layers, and the shape asks for even stages.
#include <sluice/policy/plan.hpp>

int main() {
  using p = sluice::policy::plan<sluice::policy::tp4_pp2, sluice::policy::offload::none,
                                 sluice::policy::model_shape<61, 256, true>>;
  return static_cast<int>(sizeof(p));
}
