#pragma once
/// \file
/// Rank identity and rendezvous settings from the environment, as launchers
/// set them: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (torchrun),
/// SLUICE_COMM_TIMEOUT_MS, and where the ranks meet:
///
/// - SLUICE_STORE_DIR: a Gloo file store, a directory every rank reaches (one
///   node, or a shared filesystem for several), created and emptied by
///   `sluice-launch`;
/// - SLUICE_STORE=redis://HOST:PORT/PREFIX: Gloo's Redis store, for nodes
///   without a shared filesystem (Debian's redis-server; metadata only — the
///   data goes over Gloo's TCP pairs). PREFIX names the run: keys of an
///   earlier run under another prefix are ignored;
/// - a `kv_store` the program supplies (rank_info::kv; not from the
///   environment), e.g. a torch.distributed store;
/// - SLUICE_GLOO_HOST: the address this rank's Gloo device listens on (peers
///   on other nodes connect to it; default 127.0.0.1, one node).

#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <sluice/error.hpp>

namespace sluice::inline v0::comm {

/// A key-value store the ranks meet through, supplied by the embedding
/// program (e.g. the Python package's adapter over a torch.distributed store,
/// which `torchrun` processes already share). Gloo's rendezvous (and anything
/// else that exchanges small blobs at start-up) uses it instead of a file
/// store or Redis. Calls come from the thread that joins the world; an
/// implementation must be safe to call from any thread.
struct kv_store {
  virtual ~kv_store() = default;
  /// Stores `value` under `key` (replacing it).
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  /// The value of `key`, blocking until some rank has set it or `timeout`
  /// passed (then throws comm_error naming the key).
  virtual std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  /// Blocks until every key is set, or throws comm_error after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  /// Removes `key` (a key that is not there is no error). A communicator
  /// removes the keys it set once every rank has met, or after its
  /// rendezvous failed, so that a store keeps nothing of a world. The default
  /// keeps them: a store without removal only grows by a few keys per world.
  virtual void erase(const std::string& key) { (void)key; }
};

/// Where ranks rendezvous: a key-value store, a file-store directory or a Redis server.
struct store_address {
  std::string dir;          ///< file store (when redis_host is empty)
  std::string redis_host;   ///< Redis store host
  int redis_port = 6379;
  std::string prefix;       ///< per-run key prefix (Redis, key-value store; a subdirectory of a file store)
  std::shared_ptr<kv_store> kv;  ///< a store the program supplies (takes precedence over the others)
  /// The Redis store's password (AUTH), never printed; empty: none.
  std::string password;

  [[nodiscard]] bool redis() const noexcept { return !kv && !redis_host.empty(); }
  [[nodiscard]] bool empty() const noexcept { return !kv && dir.empty() && redis_host.empty(); }

  /// "redis://host[:port][/prefix]" or a directory. Throws config_error for a malformed URL.
  [[nodiscard]] static store_address parse(const std::string& s) {
    store_address a;
    constexpr std::string_view scheme = "redis://";
    if (s.rfind(scheme, 0) != 0) {
      a.dir = s;
      return a;
    }
    std::string rest = s.substr(scheme.size());
    if (const auto slash = rest.find('/'); slash != std::string::npos) {
      a.prefix = rest.substr(slash + 1);
      rest.resize(slash);
    }
    if (const auto colon = rest.rfind(':'); colon != std::string::npos) {
      const std::string port = rest.substr(colon + 1);
      char* end = nullptr;
      const long p = std::strtol(port.c_str(), &end, 10);
      if (port.empty() || *end || p <= 0 || p > 65535)
        throw config_error(fmt::format("store '{}': port '{}' is not a TCP port", s, port));
      a.redis_port = static_cast<int>(p);
      rest.resize(colon);
    }
    if (rest.empty()) throw config_error(fmt::format("store '{}': no host (expected redis://HOST:PORT/PREFIX)", s));
    a.redis_host = rest;
    return a;
  }
};

/// Refuses a directory the ranks meet or share through (a file store, a
/// cache) that others could read or write: one this user does not own, or
/// with any group or other permission bit. Through it pass the load's secret
/// and the ranks' addresses: a co-tenant who could read it could pose as a
/// rank, one who could write it could point the ranks elsewhere. Throws
/// config_error naming the directory, its mode and owner, and the fix; an
/// io_error if it cannot be examined.
void check_private_dir(const std::string& dir, std::string_view what = "store directory");

/// Creates `dir` (and its missing parents) for check_private_dir: mode 0700
/// where it makes one (whatever the umask). An existing one is left as it is.
void make_private_dir(const std::string& dir);

/// Who this process is and how it meets its peers.
struct rank_info {
  std::size_t rank = 0;
  std::size_t world_size = 1;
  std::size_t local_rank = 0;
  std::size_t local_size = 1;   ///< ranks on this node
  std::string store_dir;         ///< file-store directory (empty: none)
  std::string store;             ///< redis://HOST:PORT/PREFIX (takes precedence over store_dir)
  /// The address this rank's Gloo device listens on and tells its peers
  /// (SLUICE_GLOO_HOST). Empty: 127.0.0.1, which a world across nodes
  /// refuses (check_reachable); set it explicitly to 127.0.0.1 to run a
  /// world of several "nodes" on one machine.
  std::string hostname;
  std::chrono::milliseconds timeout{60000};  ///< per collective and for rendezvous
  std::shared_ptr<kv_store> kv;  ///< a store the program supplies (takes precedence over store and store_dir)
  std::string kv_prefix;         ///< key prefix within `kv` (one per load)
  /// The Redis store's password: SLUICE_STORE_PASSWORD, or the contents of
  /// SLUICE_STORE_PASSWORD_FILE (this user's, mode 0600 or 0400; one trailing
  /// newline dropped). Never printed.
  std::string store_password;

  /// Reads the variables above (missing: a one-rank world). Throws config_error for malformed values.
  [[nodiscard]] static rank_info from_env() {
    rank_info r;
    auto num = [](const char* name, std::size_t def) -> std::size_t {
      const char* v = std::getenv(name);
      if (!v || !*v) return def;
      char* end = nullptr;
      const auto x = std::strtoull(v, &end, 10);
      if (*end) throw config_error(fmt::format("environment variable {}='{}' is not a number", name, v));
      return static_cast<std::size_t>(x);
    };
    r.rank = num("RANK", 0);
    r.world_size = num("WORLD_SIZE", 1);
    r.local_rank = num("LOCAL_RANK", r.rank);
    r.local_size = num("LOCAL_WORLD_SIZE", r.world_size);
    r.timeout = std::chrono::milliseconds(num("SLUICE_COMM_TIMEOUT_MS", 60000));
    if (const char* d = std::getenv("SLUICE_STORE_DIR")) r.store_dir = d;
    if (const char* u = std::getenv("SLUICE_STORE"); u && *u) {
      (void)store_address::parse(u);  // malformed: a config_error now, not at rendezvous
      r.store = u;
    }
    if (const char* h = std::getenv("SLUICE_GLOO_HOST"); h && *h) r.hostname = h;
    if (const char* p = std::getenv("SLUICE_STORE_PASSWORD"); p && *p)
      r.store_password = p;
    else if (const char* f = std::getenv("SLUICE_STORE_PASSWORD_FILE"); f && *f)
      r.store_password = read_password_file(f);
    if (r.rank >= r.world_size) throw config_error(fmt::format("RANK={} is not below WORLD_SIZE={}", r.rank, r.world_size));
    return r;
  }

  /// Throws config_error when this rank's world spans nodes (`world_size` >
  /// `local_size`) but no address was given (`hostname` empty): it would
  /// tell the other nodes 127.0.0.1, and they would connect to themselves.
  /// Names SLUICE_GLOO_HOST and the launcher's --host, where it is set. An
  /// explicit loopback address is taken as meant (nodes simulated on one
  /// machine).
  void check_reachable() const {
    if (world_size > local_size && hostname.empty())
      throw config_error(fmt::format(
          "rank {} of a world of {} ranks on more than one node ({} on this node) would tell the other nodes to connect "
          "to '{}', which only this machine reaches: set SLUICE_GLOO_HOST (sluice-launch --host) to this node's address",
          rank, world_size, local_size, address()));
  }

  /// The address to listen on: `hostname`, or 127.0.0.1 when it is empty.
  [[nodiscard]] std::string address() const { return hostname.empty() ? std::string("127.0.0.1") : hostname; }

  /// The rendezvous: `store` when set, else the file store in `store_dir`.
  [[nodiscard]] store_address rendezvous() const {
    if (kv) return store_address{{}, {}, 6379, kv_prefix, kv};
    auto a = store.empty() ? store_address{store_dir, {}, 6379, {}} : store_address::parse(store);
    a.password = store_password;
    return a;
  }

  /// A password file's contents (see store_password). Throws config_error
  /// naming the file (never its contents) if others can read it or it is
  /// not this user's.
  [[nodiscard]] static std::string read_password_file(const std::string& path);
};

}  // namespace sluice::inline v0::comm
