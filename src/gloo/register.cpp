// Linking sluice::gloo makes multi-rank worlds of the tool-level loads
// (distributed/world.hpp) Gloo worlds. The target's link option
// --undefined=sluice_gloo_link pulls this member out of the archive (an
// unreferenced member, and its initialiser, would be dropped); see
// docs/design.md, "Components and CMake targets".

#include <memory>

#include <sluice/gloo/communicator.hpp>

extern "C" void sluice_gloo_link() {}

namespace sluice::inline v0::comm::detail {
namespace {
const bool gloo_world_registered =
    register_world([](const rank_info& who) { return std::make_unique<communicator_holder<gloo>>(who); });
}  // namespace
}  // namespace sluice::inline v0::comm::detail
