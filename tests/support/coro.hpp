#pragma once
// Running coroutines in tests: every coroutine goes through run(), which
// rethrows after io_context::run() (failing REQUIREs inside coroutines are
// exceptions; `detached` would swallow them).

#include <utility>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <sluice/core/run.hpp>
#include <sluice/core/task.hpp>

namespace sluice_test {

template <class T>
T run(sluice::task<T> t) {
  return sluice::run_blocking(std::move(t));
}

/// A fresh directory under $TMPDIR, removed at scope exit.
struct scratch_dir {
  std::filesystem::path path;
  scratch_dir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "sluice-test-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
};

}  // namespace sluice_test
