// Must not compile: 100 routed experts per layer do not spread over EP=8.
#include <sluice/policy/plan.hpp>

int main() {
  using p = sluice::policy::plan<sluice::policy::tp1_dp8_ep8, sluice::policy::offload::none,
                                 sluice::policy::model_shape<61, 100>>;
  return static_cast<int>(sizeof(p));
}
