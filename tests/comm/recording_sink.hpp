#pragma once
// The sink of the distributed tests: digests what a rank holds (bytes and
// shared views) and records the name of every tensor it is called for, once
// (a tensor read at delivery comes in ordered pieces: its first one),
// placeholders included, so that tests can check that every rank's sink saw
// the same sequence.
// Device views come only from testing::emulated_device_lane here (host
// memory): it records their names and digests them like bytes.
#include <string>
#include <vector>

#include <sluice/sink/digest_sink.hpp>

namespace sluice_test {

struct recording_sink {
  static constexpr bool device_views = true;  // the emulated lane's "device" views are host memory
  sluice::digest_sink digests;
  std::vector<std::string> calls;   // tensor names, in call order
  std::vector<std::string> device;  // names of the device views (emulated lane)
  std::vector<std::string> host;    // names of the views whose home is host memory (sluice::host_resident)
  bool accept(sluice::tensor_view v) {
    if (!v.first()) return digests.accept(std::move(v));  // a later piece of the tensor of the last call
    calls.push_back(std::string(v.name()));
    if (sluice::host_resident(v)) host.push_back(std::string(v.name()));
    if (!v.carries_data()) return true;
    if (v.kind == sluice::view_kind::device) device.push_back(std::string(v.name())), v.kind = sluice::view_kind::bytes;
    return digests.accept(std::move(v));
  }
};

}  // namespace sluice_test
