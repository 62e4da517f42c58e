// unmap_later (core/unmapper.hpp): one thread that munmaps what it is given.

#include <sluice/core/unmapper.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

namespace sluice::inline v0 {

namespace {

// Never destroyed (see unmap_later): its thread waits for work until the
// process exits, when the kernel unmaps whatever is left.
class unmapper {
 public:
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
  void start() {  // under mu_
    std::thread t([this] { run(); });
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

void unmap_later(void* addr, std::size_t length) noexcept {
  // Leaked on purpose: a view released during static destruction still finds it.
  static auto* u = new unmapper;
  u->push(addr, length);
}

}  // namespace sluice::inline v0
