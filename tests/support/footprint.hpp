#pragma once
// What a load made that could outlive it, counted inside the process that
// ran it and only among what that load could have made: other processes on a
// busy machine (other tests, other builds) create and remove descriptors,
// threads and shared memory meanwhile, and must not change a count.
//
// - fds: this process's open descriptors (/proc/self/fd). A test takes the
//   first count after opening its own files, so only the load's are compared.
// - threads: this process's threads (/proc/self/task), io_uring's kernel
//   workers aside: `iou-wrk-*` and `iou-sqp-*` are listed there but exit by
//   themselves after their ring is gone (asynchronously); a ring left open
//   shows as a descriptor instead. Sanitizer runtime threads are started
//   before the first count (start_runtime_threads).
// - segments: the load's shared segments, by the unique name the test gave
//   them (distributed_options::segment_name): descriptors linking to
//   "/memfd:<name>...", mappings of it in /proc/self/maps, and /dev/shm
//   entries whose name starts with it (a memfd never has one; a named
//   segment would).
// - store keys: regular files under the load's own rendezvous directory
//   (a file store's keys are its files). Counted where no rank of the load
//   runs any more (the parent, after every rank ended), since every rank of
//   the load writes there.
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>

namespace sluice_test {

struct footprint {
  std::size_t fds = 0, threads = 0, segment_fds = 0, segment_maps = 0, shm_entries = 0;
  std::string fd_targets, thread_names;  // for the log: what the descriptors and threads are

  // Starts the threads that a sanitizer's runtime adds at a process's first
  // thread creation, so that they are there before the first count and not
  // taken for the load's: ThreadSanitizer starts a background thread then
  // (again in a forked child), which stays. Call it before counting.
  static void start_runtime_threads() { std::thread([] {}).join(); }

  // Mappings of the load's segments (names starting `segment_name`) in a
  // process's maps file: "/proc/self/maps", or "/proc/<pid>/maps" of another
  // process of the test (a rank that fails on purpose can count its peers'
  // mappings at that moment, when theirs are certainly still there).
  static std::size_t segment_maps_in(const std::filesystem::path& maps_file, std::string_view segment_name) {
    const std::string memfd = "/memfd:" + std::string(segment_name);
    std::ifstream maps(maps_file);
    std::size_t n = 0;
    for (std::string line; std::getline(maps, line);) n += line.find(memfd) != std::string::npos ? 1 : 0;
    return n;
  }

  // Counts now; `segment_name` is the prefix of the load's segments.
  static footprint now(std::string_view segment_name) {
    namespace fs = std::filesystem;
    footprint f;
    const std::string memfd = "/memfd:" + std::string(segment_name);
    std::error_code ec;
    for (auto it = fs::directory_iterator("/proc/self/fd", ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      char target[PATH_MAX] = {};
      const auto n = ::readlink(it->path().c_str(), target, sizeof target - 1);
      const std::string t(target, n > 0 ? static_cast<std::size_t>(n) : 0);
      ++f.fds;
      f.segment_fds += t.starts_with(memfd) ? 1 : 0;
      f.fd_targets += it->path().filename().string() + "->" + t + " ";
    }
    for (auto it = fs::directory_iterator("/proc/self/task", ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      // A thread that has exited (joined) can still be listed for a moment
      // on a busy machine, its comm unreadable and its state Z or X: gone,
      // not the load's.
      std::ifstream stat(it->path() / "stat");
      std::string line;
      std::getline(stat, line);
      const auto close = line.rfind(')');
      if (close == std::string::npos || close + 2 >= line.size() || line[close + 2] == 'Z' || line[close + 2] == 'X') continue;
      std::ifstream comm(it->path() / "comm");
      std::string name;
      if (!std::getline(comm, name)) continue;
      if (name.starts_with("iou-wrk-") || name.starts_with("iou-sqp-")) continue;
      ++f.threads;
      f.thread_names += name + " ";
    }
    f.segment_maps = segment_maps_in("/proc/self/maps", segment_name);
    for (auto it = fs::directory_iterator("/dev/shm", ec); !ec && it != fs::directory_iterator(); it.increment(ec))
      f.shm_entries += it->path().filename().string().starts_with(segment_name) ? 1 : 0;
    return f;
  }

  // Everything counted, without the log text.
  [[nodiscard]] bool same_counts(const footprint& o) const {
    return fds == o.fds && threads == o.threads && segment_fds == o.segment_fds && segment_maps == o.segment_maps &&
           shm_entries == o.shm_entries;
  }
  [[nodiscard]] std::string str() const {
    return "fds " + std::to_string(fds) + " threads " + std::to_string(threads) + " segment fds " +
           std::to_string(segment_fds) + " segment maps " + std::to_string(segment_maps) + " /dev/shm " +
           std::to_string(shm_entries) + "\n  fds: " + fd_targets + "\n  threads: " + thread_names;
  }
};

// Regular files under `dir` (recursively): a file store's keys, and the
// temporary files it writes them through.
inline std::size_t store_keys(const std::filesystem::path& dir, std::string* names = nullptr) {
  namespace fs = std::filesystem;
  std::size_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    ++n;
    if (names) *names += fs::relative(it->path(), dir, ec).string() + " ";
  }
  return n;
}

}  // namespace sluice_test
