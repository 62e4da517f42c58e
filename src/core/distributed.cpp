// The distributed drivers of the tool-level loads without a device lane
// (one process: comm::local; a world: comm::any_communicator), compiled once
// (see distributed/driver.hpp); comm::gloo's is in src/gloo.

#include <sluice/comm/any_communicator.hpp>
#include <sluice/distributed/driver.hpp>

namespace sluice::inline v0::detail {

template distributed_stats drive<comm::local, no_device_lane>(const checkpoint&, comm::local&, const policy::load_plan&,
                                                              any_sink, const distributed_options&, const source_factory&, bool,
                                                              no_device_lane&);
template distributed_stats drive<comm::any_communicator, no_device_lane>(const checkpoint&, comm::any_communicator&,
                                                                         const policy::load_plan&, any_sink,
                                                                         const distributed_options&, const source_factory&, bool,
                                                                         no_device_lane&);

}  // namespace sluice::inline v0::detail
