// The distributed driver over Gloo without a device lane, compiled once into
// the gloo component (declared extern in distributed/world.hpp).

#include <sluice/comm/gloo.hpp>
#include <sluice/distributed/driver.hpp>

namespace sluice::inline v0::detail {

template distributed_stats drive<comm::gloo, no_device_lane>(const checkpoint&, comm::gloo&, const policy::load_plan&,
                                                             any_sink, const distributed_options&, const reader_factory&,
                                                             no_device_lane&);

}  // namespace sluice::inline v0::detail
