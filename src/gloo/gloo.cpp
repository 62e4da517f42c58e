// The compiled part of sluice::gloo: everything that includes Gloo's headers.
#include <sluice/comm/gloo.hpp>

#include <cstring>
#include <exception>
#include <vector>

#include <fmt/format.h>

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

namespace sluice::inline v0::comm {

struct gloo::impl {
  std::shared_ptr<::gloo::transport::Device> device;
  std::shared_ptr<::gloo::rendezvous::Context> context;
  std::chrono::milliseconds timeout{};
};

namespace {
// Gloo reports a dead peer, a timeout or a misuse as an exception of its own
// (gloo::IoException, gloo::EnforceNotMet, ...): one sluice error for all.
template <class F>
void guarded(const char* what, std::size_t rank, F&& f) {
  try {
    f();
  } catch (const comm_error&) {
    throw;
  } catch (const std::exception& e) {
    throw comm_error(fmt::format("gloo {} failed on rank {}: {}", what, rank, e.what()));
  }
}
}  // namespace

gloo::gloo(std::size_t rank, std::size_t size, const gloo_options& opt)
    : impl_(std::make_unique<impl>()), rank_(rank), size_(size) {
  if (size == 0 || rank >= size) throw config_error(fmt::format("gloo: rank {} of a world of {}", rank, size));
  if (opt.store_dir.empty()) throw config_error("gloo: no store directory (set SLUICE_STORE_DIR or gloo_options::store_dir)");
  impl_->timeout = opt.timeout;
  guarded("rendezvous", rank, [&] {
    ::gloo::transport::tcp::attr attr;
    attr.hostname = opt.hostname;
    impl_->device = ::gloo::transport::tcp::CreateDevice(attr);
    ::gloo::rendezvous::FileStore store(opt.store_dir);
    auto ctx = std::make_shared<::gloo::rendezvous::Context>(static_cast<int>(rank), static_cast<int>(size));
    ctx->setTimeout(opt.timeout);
    ctx->connectFullMesh(store, impl_->device);
    impl_->context = std::move(ctx);
  });
}

gloo::gloo(const rank_info& who)
    : gloo(who.rank, who.world_size, gloo_options{who.store_dir, "127.0.0.1", who.timeout}) {}

gloo::gloo(gloo&&) noexcept = default;
gloo& gloo::operator=(gloo&&) noexcept = default;
gloo::~gloo() = default;

void gloo::broadcast(std::span<std::byte> buf, std::size_t root) {
  if (root >= size_) throw config_error(fmt::format("gloo broadcast: root {} of a world of {}", root, size_));
  if (size_ == 1 || buf.empty()) return;
  guarded("broadcast", rank_, [&] {
    ::gloo::BroadcastOptions o(impl_->context);
    o.setOutput(reinterpret_cast<std::uint8_t*>(buf.data()), buf.size());
    o.setRoot(static_cast<int>(root));
    o.setTimeout(impl_->timeout);
    ::gloo::broadcast(o);
  });
}

void gloo::all_gather(std::span<const std::byte> in, std::span<std::byte> out) {
  if (out.size() != in.size() * size_)
    throw config_error(fmt::format("gloo all_gather: output of {} bytes for {} ranks x {}", out.size(), size_, in.size()));
  if (size_ == 1) {
    if (!in.empty() && in.data() != out.data()) std::memmove(out.data(), in.data(), in.size());
    return;
  }
  if (in.empty()) return barrier();
  guarded("all_gather", rank_, [&] {
    ::gloo::AllgatherOptions o(impl_->context);
    o.setInput(const_cast<std::uint8_t*>(reinterpret_cast<const std::uint8_t*>(in.data())), in.size());
    o.setOutput(reinterpret_cast<std::uint8_t*>(out.data()), out.size());
    o.setTimeout(impl_->timeout);
    ::gloo::allgather(o);
  });
}

void gloo::all_gather_v(std::span<std::byte> buf, std::span<const std::size_t> counts) {
  if (counts.size() != size_) throw config_error(fmt::format("gloo all_gather_v: {} counts for {} ranks", counts.size(), size_));
  std::size_t total = 0;
  for (auto c : counts) total += c;
  if (total != buf.size()) throw config_error(fmt::format("gloo all_gather_v: counts sum to {}, buffer has {}", total, buf.size()));
  if (size_ == 1 || total == 0) return;
  guarded("all_gather_v", rank_, [&] {
    ::gloo::AllgathervOptions o(impl_->context);
    // No input: this rank's part is already in place in the output.
    o.setOutput(reinterpret_cast<std::uint8_t*>(buf.data()), std::vector<std::size_t>(counts.begin(), counts.end()));
    o.setTimeout(impl_->timeout);
    ::gloo::allgatherv(o);
  });
}

void gloo::barrier() {
  if (size_ == 1) return;
  guarded("barrier", rank_, [&] {
    ::gloo::BarrierOptions o(impl_->context);
    o.setTimeout(impl_->timeout);
    ::gloo::barrier(o);
  });
}

}  // namespace sluice::inline v0::comm
