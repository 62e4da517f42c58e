// comm::nccl over NCCL's non-blocking communicator: every wait polls
// ncclCommGetAsyncError against a deadline and aborts on expiry.
#include <nccl.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include <fmt/format.h>

#include <sluice/comm/nccl.hpp>
#include <sluice/cuda/error.hpp>

namespace sluice::inline v0::comm {
namespace {
using clk = std::chrono::steady_clock;
static_assert(sizeof(ncclUniqueId) == std::tuple_size_v<nccl::unique_id>);

std::string describe(ncclResult_t r, ncclComm_t c = nullptr) {
  std::string s = fmt::format("{} ({})", ::ncclGetErrorString(r), static_cast<int>(r));
  if (c) {
    if (const char* last = ::ncclGetLastError(c); last && *last) s += fmt::format(": {}", last);
  } else if (const char* last = ::ncclGetLastError(nullptr); last && *last) {
    s += fmt::format(": {}", last);
  }
  return s;
}

void check(ncclResult_t r, const char* call, ncclComm_t c = nullptr) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  throw nccl_error(call, static_cast<int>(r), describe(r, c));
}
}  // namespace

struct nccl::impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  nccl_options opt;
  bool broken = false;

  ~impl() {
    if (comm) {
      if (broken) {
        (void)::ncclCommAbort(comm);
      } else {
        (void)::ncclCommFinalize(comm);
        // Finalize is non-blocking on this communicator: wait (bounded) for it.
        const auto deadline = clk::now() + opt.timeout;
        ncclResult_t st = ncclInProgress;
        while (::ncclCommGetAsyncError(comm, &st) == ncclSuccess && st == ncclInProgress && clk::now() < deadline)
          std::this_thread::yield();
        if (st == ncclSuccess)
          (void)::ncclCommDestroy(comm);
        else
          (void)::ncclCommAbort(comm);
      }
    }
    if (stream) (void)::cudaStreamDestroy(stream);
  }

  // Waits until the communicator's pending operation (init, a call that
  // returned ncclInProgress) is done.
  void settle(const char* call) {
    const auto deadline = clk::now() + opt.timeout;
    for (;;) {
      ncclResult_t st = ncclSuccess;
      check(::ncclCommGetAsyncError(comm, &st), "ncclCommGetAsyncError", comm);
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) {
        broken = true;
        throw nccl_error(call, static_cast<int>(st), describe(st, comm));
      }
      if (clk::now() > deadline) {
        broken = true;
        throw comm_error(fmt::format("{}: no completion within {} ms (a peer is gone or stalled)", call, opt.timeout.count()));
      }
      std::this_thread::yield();
    }
  }

  void call(ncclResult_t r, const char* name) {
    if (r == ncclInProgress) return settle(name);
    if (r != ncclSuccess) {
      broken = true;
      check(r, name, comm);
    }
  }

  // Waits for `s`, watching the communicator for asynchronous errors.
  void wait(cudaStream_t s, const char* what) {
    const auto deadline = clk::now() + opt.timeout;
    for (;;) {
      const auto q = ::cudaStreamQuery(s);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        broken = true;
        cuda::check(q, "cudaStreamQuery", {fmt::format("NCCL {}", what)});
      }
      ncclResult_t st = ncclSuccess;
      (void)::ncclCommGetAsyncError(comm, &st);
      if (st != ncclSuccess && st != ncclInProgress) {
        broken = true;
        throw nccl_error(what, static_cast<int>(st), describe(st, comm));
      }
      if (clk::now() > deadline) {
        broken = true;
        throw comm_error(fmt::format("NCCL {}: not complete within {} ms (a peer is gone or stalled)", what, opt.timeout.count()));
      }
      std::this_thread::yield();
    }
  }

  void broadcast(std::span<std::byte> buf, std::size_t root, cudaStream_t s) {
    const std::size_t chunk = opt.chunk_bytes ? opt.chunk_bytes : buf.size();
    for (std::size_t off = 0; off < buf.size(); off += chunk) {
      const std::size_t n = std::min(chunk, buf.size() - off);
      call(::ncclBroadcast(buf.data() + off, buf.data() + off, n, ncclUint8, static_cast<int>(root), comm, s),
           "ncclBroadcast");
    }
  }
};

nccl::unique_id nccl::make_unique_id() {
  ncclUniqueId id{};
  check(::ncclGetUniqueId(&id), "ncclGetUniqueId");
  unique_id out{};
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

nccl::unique_id nccl::exchange_id(const rank_info& who) {
  if (who.store_dir.empty()) throw config_error("NCCL rendezvous: no store directory (SLUICE_STORE_DIR)");
  const auto path = std::filesystem::path(who.store_dir) / "sluice-nccl-id";
  unique_id id{};
  if (who.rank == 0) {
    id = make_unique_id();
    const auto tmp = path.string() + fmt::format(".tmp.{}", ::getpid());
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(id.data()), static_cast<std::streamsize>(id.size()));
      if (!f) throw io_error("cannot write the NCCL unique id", {tmp});
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);  // atomic: readers never see a partial id
    if (ec) throw io_error(fmt::format("cannot publish the NCCL unique id: {}", ec.message()), {path.string()}, ec.value());
    return id;
  }
  const auto deadline = clk::now() + who.timeout;
  for (;;) {
    std::ifstream f(path, std::ios::binary);
    if (f && f.read(reinterpret_cast<char*>(id.data()), static_cast<std::streamsize>(id.size()))) return id;
    if (clk::now() > deadline)
      throw comm_error(fmt::format("NCCL rendezvous: rank 0 published no id within {} ms", who.timeout.count()),
                       {path.string()});
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

nccl::nccl(std::size_t rank, std::size_t size, const unique_id& id, nccl_options opt)
    : impl_(std::make_unique<impl>()), rank_(rank), size_(size) {
  impl_->opt = opt;
  if (rank >= size) throw config_error(fmt::format("NCCL: rank {} is not below size {}", rank, size));
  cuda::check(::cudaSetDevice(opt.device), "cudaSetDevice", {fmt::format("device {} for NCCL rank {}", opt.device, rank)});
  cuda::check(::cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof nid);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  const auto r = ::ncclCommInitRankConfig(&impl_->comm, static_cast<int>(size), nid, static_cast<int>(rank), &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    impl_->broken = true;
    throw nccl_error("ncclCommInitRankConfig", static_cast<int>(r), describe(r));
  }
  impl_->settle("ncclCommInitRankConfig");
}

nccl::nccl(nccl&&) noexcept = default;
nccl& nccl::operator=(nccl&&) noexcept = default;
nccl::~nccl() = default;

cudaStream_t nccl::stream() const noexcept { return impl_ ? impl_->stream : nullptr; }
int nccl::device() const noexcept { return impl_ ? impl_->opt.device : -1; }

void nccl::broadcast(std::span<std::byte> buf, std::size_t root) {
  impl_->broadcast(buf, root, impl_->stream);
  impl_->wait(impl_->stream, "ncclBroadcast");
}

void nccl::broadcast_async(std::span<std::byte> buf, std::size_t root, cudaStream_t s) { impl_->broadcast(buf, root, s); }

void nccl::wait(cudaStream_t s) { impl_->wait(s, "collective"); }

void nccl::all_gather(std::span<const std::byte> in, std::span<std::byte> out) {
  if (out.size() != in.size() * size_)
    throw config_error(fmt::format("NCCL all_gather: output holds {} bytes, expected {} x {}", out.size(), size_, in.size()));
  impl_->call(::ncclAllGather(in.data(), out.data(), in.size(), ncclUint8, impl_->comm, impl_->stream), "ncclAllGather");
  impl_->wait(impl_->stream, "ncclAllGather");
}

void nccl::all_gather_v(std::span<std::byte> buf, std::span<const std::size_t> counts) {
  if (counts.size() != size_) throw config_error(fmt::format("NCCL all_gather_v: {} counts for {} ranks", counts.size(), size_));
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  if (total > buf.size()) throw config_error(fmt::format("NCCL all_gather_v: counts sum to {} bytes, buffer holds {}", total, buf.size()));
  // One broadcast per rank's part, grouped: NCCL runs them as one operation.
  impl_->call(::ncclGroupStart(), "ncclGroupStart");
  std::size_t off = 0;
  for (std::size_t r = 0; r < size_; ++r) {
    if (counts[r])
      impl_->call(::ncclBroadcast(buf.data() + off, buf.data() + off, counts[r], ncclUint8, static_cast<int>(r),
                                  impl_->comm, impl_->stream),
                  "ncclBroadcast");
    off += counts[r];
  }
  impl_->call(::ncclGroupEnd(), "ncclGroupEnd");
  impl_->wait(impl_->stream, "all_gather_v");
}

void nccl::exchange(std::span<const send_message> sends, std::span<const recv_message> recvs) {
  for (const auto& m : sends)
    if (m.peer >= size_ || m.peer == rank_) throw config_error(fmt::format("NCCL exchange: rank {} cannot send to rank {}", rank_, m.peer));
  for (const auto& m : recvs)
    if (m.peer >= size_ || m.peer == rank_) throw config_error(fmt::format("NCCL exchange: rank {} cannot receive from rank {}", rank_, m.peer));
  if (sends.empty() && recvs.empty()) return;
  // NCCL pairs a peer's sends with our receives in the order they are issued
  // within the group: both sides list their messages in the same (plan) order.
  impl_->call(::ncclGroupStart(), "ncclGroupStart");
  for (const auto& m : recvs)
    if (!m.bytes.empty())
      impl_->call(::ncclRecv(m.bytes.data(), m.bytes.size(), ncclUint8, static_cast<int>(m.peer), impl_->comm, impl_->stream),
                  "ncclRecv");
  for (const auto& m : sends)
    if (!m.bytes.empty())
      impl_->call(::ncclSend(m.bytes.data(), m.bytes.size(), ncclUint8, static_cast<int>(m.peer), impl_->comm, impl_->stream),
                  "ncclSend");
  impl_->call(::ncclGroupEnd(), "ncclGroupEnd");
  impl_->wait(impl_->stream, "exchange");
}

void nccl::barrier() {
  // An all-reduce of one int in device memory: returns when every rank reached it.
  void* d = nullptr;
  cuda::check(::cudaMallocAsync(&d, sizeof(int), impl_->stream), "cudaMallocAsync", {"NCCL barrier"});
  cuda::check(::cudaMemsetAsync(d, 0, sizeof(int), impl_->stream), "cudaMemsetAsync", {"NCCL barrier"});
  try {
    impl_->call(::ncclAllReduce(d, d, 1, ncclInt32, ncclSum, impl_->comm, impl_->stream), "ncclAllReduce");
    (void)::cudaFreeAsync(d, impl_->stream);
    impl_->wait(impl_->stream, "barrier");
  } catch (...) {
    (void)::cudaFreeAsync(d, impl_->stream);
    throw;
  }
}

}  // namespace sluice::inline v0::comm
