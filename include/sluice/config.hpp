#pragma once
/// \file
/// Configuration macros (SLUICE_*) and the ABI-versioned namespace.

#include <sluice/version.hpp>

#if !defined(__cpp_impl_coroutine) || __cpp_impl_coroutine < 201902L
#error "sluice: C++20 coroutines are required (g++ >= 12 with -std=c++20)"
#endif

/// Poisoning of recycled staging slots (a use-after-release then reads 0xDB bytes).
/// On by default in debug builds; set to 0 or 1 to force.
#ifndef SLUICE_POISON_SLOTS
#ifdef NDEBUG
#define SLUICE_POISON_SLOTS 0
#else
#define SLUICE_POISON_SLOTS 1
#endif
#endif
