#pragma once
// Names the calling thread for `top -H`, `ps -L`, perf, gdb and py-spy, so
// that an operator looking at an engine's threads tells sluice's apart from
// the engine's (unnamed, a thread shows the name of the thread that started
// it: the process's, or the engine's). Linux keeps 15 characters; a longer
// name is cut. A failure is ignored: the name is only for people.
#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

namespace sluice::inline v0::detail {

inline void name_this_thread(const char* name) noexcept {
  char cut[16] = {};
  std::memcpy(cut, name, std::min(std::strlen(name), sizeof cut - 1));
  (void)::pthread_setname_np(::pthread_self(), cut);
}

/// A thread that runs `f` under `name` (see name_this_thread).
template <class F>
std::thread named_thread(const char* name, F&& f) {
  return std::thread([name, f = std::forward<F>(f)]() mutable {
    name_this_thread(name);
    f();
  });
}

}  // namespace sluice::inline v0::detail
