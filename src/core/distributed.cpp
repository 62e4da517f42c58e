// The distributed driver for one process (comm::local) without a device lane,
// compiled once (see distributed/driver.hpp); comm::gloo's is in src/gloo.

#include <sluice/distributed/driver.hpp>

namespace sluice::inline v0::detail {

template distributed_stats drive<comm::local, no_device_lane>(const checkpoint&, comm::local&, const policy::load_plan&,
                                                              any_sink, const distributed_options&, const reader_factory&,
                                                              no_device_lane&);

}  // namespace sluice::inline v0::detail
