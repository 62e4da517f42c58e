#pragma once
// The sink of the distributed tests: digests what a rank holds (bytes and
// shared views) and records the name of every call, placeholders included,
// so that tests can check that every rank's sink saw the same sequence.
#include <string>
#include <vector>

#include <sluice/sink/digest_sink.hpp>

namespace sluice_test {

struct recording_sink {
  sluice::digest_sink digests;
  std::vector<std::string> calls;  // tensor names, in call order
  bool accept(sluice::tensor_view v) {
    calls.push_back(std::string(v.name()));
    if (v.kind == sluice::view_kind::metadata) return true;
    return digests.accept(std::move(v));
  }
};

}  // namespace sluice_test
