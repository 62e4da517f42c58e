// unmap_later (memory/unmapper.hpp): one thread that munmaps what it is given.

#include <sluice/memory/unmapper.hpp>

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <new>
#include <thread>
#include <utility>

#include "../core/thread_name.hpp"

namespace sluice::inline v0 {

namespace {

// Never destroyed (see the()): its thread waits for work until the
// process exits, when the kernel unmaps whatever is left.
class unmapper {
 public:
  static unmapper& the() {
    // Leaked on purpose: a view released during static destruction still finds it.
    static auto* u = [] {
      auto* made = new unmapper;
      ::pthread_atfork(nullptr, nullptr, [] { the().after_fork_in_child(); });
      return made;
    }();
    return *u;
  }

  void push(void* addr, std::size_t length) noexcept {
    try {
      std::unique_lock l(mu_);
      if (owner_ != ::getpid()) start();  // first use, or a child forked since: its thread is not here
      queue_.emplace_back(addr, length);
      l.unlock();
      wake_.notify_one();
    } catch (...) {  // no thread, or no memory for the queue: unmap here
      ::munmap(addr, length);
    }
  }

 private:
  // In a child just forked, only the forking thread exists: the parent's
  // unmapper thread is not here, and the lock or the wait it was in at the
  // fork was copied as it was (a condition variable that counts a waiter who
  // will never wake would swallow the child's first notify). So the child
  // gets fresh ones, made over the copies without destroying them (a copied
  // mutex may be locked), and its first push starts its own thread; what was
  // queued stays queued for it.
  void after_fork_in_child() noexcept {
    new (&mu_) std::mutex();
    new (&wake_) std::condition_variable();
    owner_ = 0;
  }

  void start() {  // under mu_
    auto t = detail::named_thread("sluice-unmap", [this] { run(); });
    t.detach();
    owner_ = ::getpid();
  }

  void run() {
    std::unique_lock l(mu_);
    for (;;) {
      wake_.wait(l, [this] { return !queue_.empty(); });
      const auto [addr, length] = queue_.front();
      queue_.pop_front();
      l.unlock();
      ::munmap(addr, length);
      l.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::pair<void*, std::size_t>> queue_;
  pid_t owner_ = 0;  // the process whose thread serves the queue
};

}  // namespace

void unmap_later(void* addr, std::size_t length) noexcept { unmapper::the().push(addr, length); }

}  // namespace sluice::inline v0
