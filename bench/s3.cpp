// bench-s3: the same checkpoint read over HTTP range GETs from S3-compatible
// servers by sluice (s3_source through the load pipeline into a discard sink),
// N parallel curl processes and boto3, at the same concurrency and part size.
// Prints GiB/s and the ratio of sluice to the best alternative per server.
//
//   bench-s3 DIR --server NAME=URL[,WARM_DIR] [--server ...] --bucket B --prefix P
//            [--streams 8,16] [--part 8MiB,16MiB] [--repeat 2] [--threads 1] [--no-boto3] [--no-curl]
//
// DIR is the local copy of the checkpoint (file list and sizes); every server
// holds it as s3://B/P<file> (path-style). Credentials and region come from
// the AWS_* environment (bench/s3.sh sets them). WARM_DIR, when given, is read
// before each timed run so that the server reads from the page cache (hosts
// may reclaim idle page cache within a minute: see bench/README.md).
//
// Contenders, per (streams N, part size S):
//   sluice      one io_context thread, pool of N connections, fetch queue depth 2N
//               (N reads on the wire, N more queued for the next free connection:
//               results leave the fetch stage in order, and with depth N a read that
//               completes before the oldest one leaves its connection idle until the
//               oldest completes - the requests then go out in waves), requests of at
//               most S (coalesced tensors), pre-faulted page-aligned staging pool
//               reused across runs, discard sink;
//   qd=N        the same with queue depth N (what the blocking load, src/s3/load.cpp, sets today);
//   curl xN     N curl processes, each fetching its share of the S-byte ranges
//               (round-robin) over one keep-alive connection, to /dev/null;
//   curl/part   one curl process per S-byte range, N at a time (xargs -P N);
//   boto3       TransferManager (max_concurrency N, chunk S, N pooled connections),
//               every file submitted at once into a discarding file object; timed
//               inside Python (interpreter start and imports excluded).
// Bytes per contender: sluice reads the tensor bytes (headers were read when
// the checkpoint was opened), the others the whole files; each rate uses its
// own byte count.
//
// With --cache DIR, then, for each server with a WARM_DIR (nginx), at the first
// streams and part size, the node-local cache (cache/block_cache.hpp) side by
// side in one run: sluice without a cache; a first load through an empty cache
// (every block fetched, hashed, written and fsynced); a second load with the
// cache's files dropped from the page cache (POSIX_FADV_DONTNEED) and one with
// them hot (read once beforehand: the cache writes blocks O_DIRECT and reads
// cold ones so); a local-file load of DIR, hot; and the disk alone: the same
// bytes written as 16 MiB files, O_DIRECT and fsync each, 4 writers (the
// cache's pattern without network or hashing). Plus XXH3's CPU s/GiB.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include <sluice/sluice.hpp>
#include <sluice/cache/block_cache.hpp>
#include <sluice/s3/source.hpp>

#include "common/args.hpp"

namespace {
namespace fs = std::filesystem;
using clk = std::chrono::steady_clock;
double since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }
constexpr double gib = 1024.0 * 1024 * 1024;

struct server {
  std::string name, url, warm_dir;
};

struct object {
  std::string name;
  std::uint64_t size = 0;
};

std::vector<unsigned> parse_list(const std::string& s, bool sizes) {
  std::vector<unsigned> out;
  for (std::size_t b = 0; b <= s.size();) {
    auto e = s.find(',', b);
    if (e == std::string::npos) e = s.size();
    const auto item = s.substr(b, e - b);
    if (!item.empty()) out.push_back(static_cast<unsigned>(sizes ? sluice_cli::parse_size(item) : std::stoul(item)));
    b = e + 1;
  }
  return out;
}

// Reads every regular file under `dir` (so that the server finds it in the page cache).
void warm(const std::string& dir) {
  if (dir.empty()) return;
  static std::vector<char> buf(8 << 20);
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::FILE* f = std::fopen(e.path().c_str(), "rb");
    if (!f) continue;
    while (std::fread(buf.data(), 1, buf.size(), f) == buf.size()) {
    }
    std::fclose(f);
  }
}

// The disk alone: `bytes` written under `dir` as 16 MiB files, O_DIRECT
// and fsync each, by 4 threads (the cache's write pattern). Seconds.
double raw_write(const std::string& dir, std::uint64_t bytes) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  constexpr std::size_t block = 16 << 20;
  const std::uint64_t blocks = (bytes + block - 1) / block;
  std::atomic<std::uint64_t> next{0};
  const auto t0 = clk::now();
  std::vector<std::thread> writers;
  for (int w = 0; w < 4; ++w)
    writers.emplace_back([&] {
      void* p = nullptr;
      if (::posix_memalign(&p, 4096, block) != 0) return;
      std::memset(p, 0x5a, block);
      for (std::uint64_t i; (i = next++) < blocks;) {
        const auto path = fmt::format("{}/{}.raw", dir, i);
        const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
        if (fd < 0) continue;
        if (::write(fd, p, block) != static_cast<ssize_t>(block)) std::perror("raw_write");
        (void)::fsync(fd);
        ::close(fd);
      }
      std::free(p);
    });
  for (auto& t : writers) t.join();
  const double t = since(t0);
  fs::remove_all(dir);
  return t;
}

// Drops every file under `dir` from the page cache (written and fsynced:
// clean pages, so DONTNEED frees them).
void drop(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    (void)::fdatasync(fd);
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

int shell(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

std::string slurp(const std::string& cmd) {
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {};
  std::string out;
  char buf[4096];
  while (auto n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  if (::pclose(p) != 0) return {};
  return out;
}

struct bench {
  std::string dir, bucket, prefix, work, python = "python3";
  std::vector<object> objects;
  std::uint64_t file_bytes = 0;
  unsigned threads = 1;

  std::string object_url(const server& s, const object& o) const {
    return fmt::format("{}/{}/{}{}", s.url, bucket, prefix, o.name);
  }

  // sluice: returns {seconds, bytes}.
  std::pair<double, std::uint64_t> run_sluice(const server& s, sluice::staging_pool& pool, unsigned streams,
                                              std::uint64_t part, unsigned queue_depth) const {
    auto cfg = sluice::s3::config::from_environment();
    cfg.endpoint = sluice::s3::http_endpoint::parse(s.url);
    cfg.custom_endpoint = true;
    cfg.max_connections = streams;
    sluice::s3_catalog cat(fmt::format("s3://{}/{}", bucket, prefix), cfg);
    auto ck = sluice::checkpoint::open(cat);
    warm(s.warm_dir);
    const auto t0 = clk::now();
    boost::asio::io_context ioc{static_cast<int>(threads)};
    sluice::s3_source src(ioc.get_executor(), cfg, ck.shard_uris());
    for (std::uint32_t i = 0; i < ck.shards().size(); ++i) src.pin(i, cat.object_info(ck.shards()[i].name));
    sluice::load_options o;
    o.max_read = part;
    o.queue_depth = queue_depth;
    o.threads = threads;
    o.poison = false;
    sluice::discard_sink sink;
    auto st = sluice::run_blocking(ioc, sluice::load_async(ck, src, sink, pool, o), threads);
    return {since(t0), st.bytes_read};
  }

  // sluice through the node-local cache in `cache_dir` (headers read without
  // it, before the clock starts): {seconds, bytes, hash s/GiB}.
  std::tuple<double, std::uint64_t, double> run_cached(const server& s, sluice::staging_pool& pool, unsigned streams,
                                                       std::uint64_t part, const std::string& cache_dir) const {
    auto cfg = sluice::s3::config::from_environment();
    cfg.endpoint = sluice::s3::http_endpoint::parse(s.url);
    cfg.custom_endpoint = true;
    cfg.max_connections = streams;
    cfg.cache = {};
    sluice::s3_catalog cat(fmt::format("s3://{}/{}", bucket, prefix), cfg);
    auto ck = sluice::checkpoint::open(cat);
    warm(s.warm_dir);
    sluice::cache::options co;
    co.dir = cache_dir;
    auto cache = std::make_shared<sluice::cache::block_cache>(co);
    const auto t0 = clk::now();
    boost::asio::io_context ioc{static_cast<int>(threads)};
    sluice::s3_source src(ioc.get_executor(), cfg, ck.shard_uris());
    for (std::uint32_t i = 0; i < ck.shards().size(); ++i) src.pin(i, cat.object_info(ck.shards()[i].name));
    src.use_cache(cache, ioc);
    sluice::load_options o;
    o.max_read = part;
    o.queue_depth = 2 * streams;
    o.threads = threads;
    o.poison = false;
    sluice::discard_sink sink;
    auto st = sluice::run_blocking(ioc, sluice::load_async(ck, src, sink, pool, o), threads);
    const double t = since(t0);
    const auto& c = cache->stats();
    const double hashed = static_cast<double>(c.hashed_bytes.load()) / gib;
    return {t, st.bytes_read, hashed > 0 ? static_cast<double>(c.hash_ns.load()) / 1e9 / hashed : 0.0};
  }

  // The local directory, hot: {seconds, bytes}.
  std::pair<double, std::uint64_t> run_local(unsigned depth, std::uint64_t part) const {
    warm(dir);
    sluice::load_options o;
    o.max_read = part;
    o.queue_depth = depth;
    o.poison = false;
    sluice::discard_sink sink;
    const auto t0 = clk::now();
    auto st = sluice::load(sluice::checkpoint::open(dir), sink, o);
    return {since(t0), st.bytes_read};
  }

  // curl, N keep-alive processes (round-robin share of the ranges) or one per range.
  double run_curl(const server& s, unsigned streams, std::uint64_t part, bool per_part) const {
    const auto cfg_dir = fmt::format("{}/curl-{}", work, per_part ? "part" : "streams");
    fs::remove_all(cfg_dir);
    fs::create_directories(cfg_dir);
    std::vector<std::ofstream> cfgs;
    std::ofstream list(cfg_dir + "/ranges");
    if (!per_part)
      for (unsigned i = 0; i < streams; ++i) cfgs.emplace_back(fmt::format("{}/{:03}.cfg", cfg_dir, i));
    // An S3 server (no directory of its own to serve from: moto) checks
    // SigV4, so curl signs as every other client does, with the key pair of
    // the environment (scripts/s3-server.sh's); nginx ignores Authorization.
    // In a config file each URL block repeats it: `next` resets options.
    std::string sign_cfg, sign_args;
    const char* key = std::getenv("AWS_ACCESS_KEY_ID");
    const char* secret = std::getenv("AWS_SECRET_ACCESS_KEY");
    if (s.warm_dir.empty() && key && secret) {
      const char* region = std::getenv("AWS_REGION");
      const auto sigv4 = fmt::format("aws:amz:{}:s3", region ? region : "us-east-1");
      // curl 7.88 signs no payload hash of its own; S3 wants the header.
      sign_cfg = fmt::format("aws-sigv4 = \"{}\"\nuser = \"{}:{}\"\nheader = \"x-amz-content-sha256: UNSIGNED-PAYLOAD\"\n",
                             sigv4, key, secret);
      sign_args = fmt::format(" --aws-sigv4 {} --user {}:{} -H x-amz-content-sha256:UNSIGNED-PAYLOAD", sigv4, key, secret);
    }
    std::vector<bool> used(streams, false);
    unsigned k = 0;
    for (const auto& o : objects)
      for (std::uint64_t off = 0; off < o.size; off += part, ++k) {
        const auto last = std::min(o.size, off + part) - 1;
        if (per_part) {
          list << fmt::format("-r {}-{}{} {}\n", off, last, sign_args, object_url(s, o));
        } else {
          auto& c = cfgs[k % streams];
          c << (used[k % streams] ? "next\n" : "")
            << fmt::format("url = \"{}\"\nrange = {}-{}\noutput = /dev/null\nsilent\nshow-error\nfail\n{}",
                           object_url(s, o), off, last, sign_cfg);
          used[k % streams] = true;
        }
      }
    for (auto& c : cfgs) c.close();
    list.close();
    const auto cmd = per_part
                         ? fmt::format("xargs -P {} -L 1 curl -sS --fail -o /dev/null < {}/ranges", streams, cfg_dir)
                         : fmt::format("ls {0}/*.cfg | xargs -P {1} -n 1 curl -K", cfg_dir, streams);
    warm(s.warm_dir);
    const auto t0 = clk::now();
    if (shell(cmd) != 0) throw std::runtime_error("curl failed: " + cmd);
    return since(t0);
  }

  // boto3: seconds measured inside Python.
  double run_boto3(const server& s, unsigned streams, std::uint64_t part) const {
    std::string keys;
    for (const auto& o : objects) keys += " " + prefix + o.name;
    warm(s.warm_dir);
    const auto out = slurp(fmt::format("{} {}/boto3_get.py {} {} {} {} {}", python, work, s.url, bucket, streams,
                                       part, keys));
    if (out.empty()) throw std::runtime_error("boto3 run failed against " + s.url);
    return std::stod(out);
  }
};

constexpr const char* boto3_script = R"(import sys, time, boto3
from botocore.config import Config
from boto3.s3.transfer import TransferConfig, create_transfer_manager
url, bucket, n, part = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
keys = sys.argv[5:]
class Discard:
    def __init__(self): self.pos = 0
    def write(self, b): self.pos += len(b); return len(b)
    def seek(self, o, w=0): self.pos = o
    def tell(self): return self.pos
    def seekable(self): return True
c = boto3.client("s3", endpoint_url=url, config=Config(max_pool_connections=n, s3={"addressing_style": "path"}))
tc = TransferConfig(max_concurrency=n, multipart_chunksize=part, multipart_threshold=part, use_threads=True)
with create_transfer_manager(c, tc) as tm:
    c.head_object(Bucket=bucket, Key=keys[0])  # a warm connection, as the others get theirs inside the timing
    t0 = time.perf_counter()
    fs = [tm.download(bucket, k, Discard()) for k in keys]
    for f in fs: f.result()
    print(time.perf_counter() - t0)
)";

}  // namespace

int main(int argc, char** argv) try {
  bench b;
  std::vector<std::string> server_args;
  std::string streams_s = "8,16", parts_s = "8MiB,16MiB";
  int repeat = 2;
  bool no_boto3 = false, no_curl = false;
  CLI::App app("bench-s3: sluice's range GETs against curl and boto3 on the same objects");
  app.add_option("DIR", b.dir, "the checkpoint directory whose files are the objects")->required();
  app.add_option("--server", server_args, "NAME=URL[,WARM_DIR] (repeatable)")->required();
  app.add_option("--bucket", b.bucket, "bucket")->required();
  app.add_option("--prefix", b.prefix, "key prefix");
  app.add_option("--streams", streams_s, "connections, comma-separated")->capture_default_str();
  app.add_option("--part", parts_s, "bytes per GET, comma-separated")->capture_default_str();
  app.add_option("--repeat", repeat, "runs per row (best of)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--threads", b.threads, "io_context threads")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag("--no-boto3", no_boto3, "skip the boto3 rows");
  app.add_option("--python", b.python, "the interpreter with boto3 (bench/s3.sh passes the project's .venv)")
      ->capture_default_str();
  app.add_flag("--no-curl", no_curl, "skip the curl rows");
  std::string cache_dir;
  app.add_option("--cache", cache_dir, "then the node-local cache rows, with the cache in DIR (emptied first)");
  if (const auto code = sluice_cli::parse_args(app, argc, argv, 2)) return *code;
  const bool boto3 = !no_boto3, curl = !no_curl;
  std::vector<server> servers;
  for (const auto& v : server_args) {
    const auto eq = v.find('='), comma = v.find(',');
    if (eq == std::string::npos) return sluice_cli::fail(fmt::format("--server '{}': expected NAME=URL[,WARM_DIR]", v));
    servers.push_back({v.substr(0, eq), v.substr(eq + 1, comma == std::string::npos ? comma : comma - eq - 1),
                       comma == std::string::npos ? "" : v.substr(comma + 1)});
  }
  if (!b.prefix.empty() && b.prefix.back() != '/') b.prefix += '/';
  for (const auto& e : fs::directory_iterator(b.dir))
    if (e.is_regular_file()) b.objects.push_back({e.path().filename().string(), e.file_size()});
  std::sort(b.objects.begin(), b.objects.end(), [](auto& x, auto& y) { return x.name < y.name; });
  for (const auto& o : b.objects) b.file_bytes += o.size;
  const auto streams = parse_list(streams_s, false);
  const auto parts = parse_list(parts_s, true);
  char tmpl[] = "/tmp/bench-s3.XXXXXX";
  if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
  b.work = tmpl;
  struct remove_on_exit {
    std::string dir;
    ~remove_on_exit() { std::error_code ec; fs::remove_all(dir, ec); }
  } cleanup{b.work};
  std::ofstream(b.work + "/boto3_get.py") << boto3_script;

  std::printf("bench-s3: %zu objects, %.2f GiB, s3://%s/%s, best of %d, sluice on %u io thread(s)\n", b.objects.size(),
              static_cast<double>(b.file_bytes) / gib, b.bucket.c_str(), b.prefix.c_str(), repeat, b.threads);
  for (const auto& s : servers) {
    std::printf("\n%s (%s)\n", s.name.c_str(), s.url.c_str());
    std::printf("  %-7s %-9s %8s %8s %8s %8s %8s %8s   %s\n", "streams", "part", "sluice", "qd=N", "curl xN",
                "curl/prt", "boto3", "best alt", "sluice / best");
    for (const unsigned n : streams)
      for (const unsigned part : parts) {
        const std::uint64_t max_read = part;
        // One pre-faulted, page-aligned pool per shape, reused by every run.
        sluice::staging_pool pool({.budget = (2 * n + 4) * sluice::slot_size_for(max_read),
                                   .slot_size = sluice::slot_size_for(max_read), .poison = false, .prefault = true});
        double t_sluice = 1e30, t_sluice_n = 1e30, t_curl = 1e30, t_curl_part = 1e30, t_boto = 1e30;
        std::uint64_t sluice_bytes = 0;
        for (int r = 0; r < repeat; ++r) {   // interleaved: drift of this shared VM hits every contender
          auto [t, bytes] = b.run_sluice(s, pool, n, max_read, 2 * n);
          if (t < t_sluice) t_sluice = t, sluice_bytes = bytes;
          t_sluice_n = std::min(t_sluice_n, b.run_sluice(s, pool, n, max_read, n).first);
          if (curl) {
            t_curl = std::min(t_curl, b.run_curl(s, n, max_read, false));
            t_curl_part = std::min(t_curl_part, b.run_curl(s, n, max_read, true));
          }
          if (boto3) t_boto = std::min(t_boto, b.run_boto3(s, n, max_read));
        }
        const double fb = static_cast<double>(b.file_bytes) / gib;
        const double r_sluice = static_cast<double>(sluice_bytes) / gib / t_sluice;
        const double r_sluice_n = static_cast<double>(sluice_bytes) / gib / t_sluice_n;
        const double r_curl = curl ? fb / t_curl : 0, r_part = curl ? fb / t_curl_part : 0,
                     r_boto = boto3 ? fb / t_boto : 0;
        const double best = std::max({r_curl, r_part, r_boto});
        auto cell = [](double v) { return v > 0 ? fmt::format("{:8.2f}", v) : fmt::format("{:>8}", "-"); };
        std::printf("  %-7u %-9s %s %s %s %s %s %s   %s\n", n, sluice_cli::human_bytes(static_cast<double>(part)).c_str(),
                    cell(r_sluice).c_str(), cell(r_sluice_n).c_str(), cell(r_curl).c_str(), cell(r_part).c_str(), cell(r_boto).c_str(),
                    cell(best).c_str(), best > 0 ? fmt::format("{:.2f}x", r_sluice / best).c_str() : "-");
        std::fflush(stdout);
      }
  }
  if (!cache_dir.empty())
    for (const auto& s : servers) {
      if (s.warm_dir.empty()) continue;   // moto's 105 MiB/s would hide the cache's costs
      const unsigned n = streams.front();
      const std::uint64_t part = parts.front();
      sluice::staging_pool pool({.budget = (2 * n + 4) * sluice::slot_size_for(part),
                                 .slot_size = sluice::slot_size_for(part), .poison = false, .prefault = true});
      double t_none = 1e30, t_first = 1e30, t_cold = 1e30, t_hot = 1e30, t_local = 1e30, t_disk = 1e30, hash = 0;
      std::uint64_t bytes = 0, local_bytes = 0;
      for (int r = 0; r < repeat; ++r) {
        auto [tn, bn] = b.run_sluice(s, pool, n, part, 2 * n);
        t_none = std::min(t_none, tn);
        bytes = bn;
        fs::remove_all(cache_dir);
        t_first = std::min(t_first, std::get<0>(b.run_cached(s, pool, n, part, cache_dir)));
        drop(cache_dir);
        t_cold = std::min(t_cold, std::get<0>(b.run_cached(s, pool, n, part, cache_dir)));
        warm(cache_dir);   // blocks are written and cold ones read O_DIRECT: they are hot only when read otherwise
        auto [th, bh, hs] = b.run_cached(s, pool, n, part, cache_dir);
        t_hot = std::min(t_hot, th);
        hash = hs;
        auto [tl, bl] = b.run_local(2 * n, part);
        t_local = std::min(t_local, tl);
        local_bytes = bl;
        t_disk = std::min(t_disk, raw_write(cache_dir + ".raw", b.file_bytes));
      }
      fs::remove_all(cache_dir);
      const double g = static_cast<double>(bytes) / gib;
      auto row = [&](const char* what, double t, const std::string& ratio) {
        std::printf("  %-46s %6.2f s %8.2f GiB/s   %s\n", what, t, g / t, ratio.c_str());
      };
      std::printf("\nthe node-local cache, %s (%s), %u streams, %s parts, cache in %s\n", s.name.c_str(), s.url.c_str(), n,
                  sluice_cli::human_bytes(static_cast<double>(part)).c_str(), cache_dir.c_str());
      row("sluice, no cache", t_none, "");
      row("first load, cache written (fsync included)", t_first,
          fmt::format("{:.2f}x no cache, {:.2f}x the disk alone", t_none / t_first, t_disk / t_first));
      row("second load, cache files cold", t_cold, fmt::format("{:.2f}x no cache", t_none / t_cold));
      row("second load, cache files hot", t_hot, fmt::format("{:.2f}x the local-file load", t_local / t_hot));
      std::printf("  %-46s %6.2f s %8.2f GiB/s\n", "local files, hot (sluice-load DIR)", t_local,
                  static_cast<double>(local_bytes) / gib / t_local);
      std::printf("  %-46s %6.2f s %8.2f GiB/s\n", "the disk alone: the files' bytes as 16 MiB writes", t_disk,
                  static_cast<double>(b.file_bytes) / gib / t_disk);
      std::printf("  XXH3 verification: %.3f CPU s/GiB (one thread per block)\n", hash);
      std::fflush(stdout);
    }
  std::printf("\n(GiB/s; every contender keeps N requests on the wire; sluice: queue depth 2N, qd=N: depth N;\n"
              " curl and boto3 read the whole files, sluice the tensor bytes; boto3 timed inside Python)\n");
  std::printf("command: bench-s3 %s", b.dir.c_str());
  for (const auto& s : servers)
    std::printf(" --server %s=%s%s", s.name.c_str(), s.url.c_str(), s.warm_dir.empty() ? "" : ("," + s.warm_dir).c_str());
  std::printf(" --bucket %s --prefix %s --streams %s --part %s --repeat %d --threads %u%s%s%s\n", b.bucket.c_str(),
              b.prefix.c_str(), streams_s.c_str(), parts_s.c_str(), repeat, b.threads, boto3 ? "" : " --no-boto3",
              curl ? "" : " --no-curl", cache_dir.empty() ? "" : (" --cache " + cache_dir).c_str());
  return 0;
} catch (const std::exception& e) {
  return sluice_cli::fail(e.what());
}
