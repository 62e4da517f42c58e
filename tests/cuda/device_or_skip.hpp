#pragma once
// Device tests: without a CUDA device, report "SKIPPED: ..." (ctest's
// SKIP_REGULAR_EXPRESSION) and leave the test; no silently passing test.
#include <catch2/catch.hpp>

#include <sluice/cuda/device.hpp>

#define SLUICE_REQUIRE_DEVICE()                                                  \
  do {                                                                           \
    const auto sluice_q_ = ::sluice::cuda::query_devices();                      \
    if (!sluice_q_) {                                                            \
      WARN("SKIPPED: no CUDA device (" << sluice_q_.reason() << ")");            \
      return;                                                                    \
    }                                                                            \
  } while (0)

// No-driver tests check what happens without a device; with one they skip.
#define SLUICE_REQUIRE_NO_DEVICE()                                                          \
  do {                                                                                      \
    const auto sluice_q_ = ::sluice::cuda::query_devices();                                 \
    if (sluice_q_) {                                                                        \
      WARN("SKIPPED: a CUDA device is present; this test covers the no-driver path ("       \
           << sluice_q_.reason() << ")");                                                   \
      return;                                                                               \
    }                                                                                       \
  } while (0)
