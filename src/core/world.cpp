// The registry of the communicator that joins multi-rank worlds.

#include <sluice/comm/any_communicator.hpp>
#include <sluice/comm/store.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <mutex>

#include <fmt/format.h>

#include <sluice/error.hpp>

namespace sluice::inline v0::comm {

namespace {
struct world_registry {
  std::mutex m;
  world_factory join;
};
world_registry& registry() {
  static world_registry r;
  return r;
}
}  // namespace

bool register_world(world_factory join) {
  auto& r = registry();
  std::lock_guard lock(r.m);
  r.join = std::move(join);
  return true;
}

std::unique_ptr<any_communicator> join_world(const rank_info& who) {
  world_factory join;
  {
    auto& r = registry();
    std::lock_guard lock(r.m);
    join = r.join;
  }
  if (!join)
    throw missing_component_error(
        "sluice::gloo", fmt::format("a {}-rank load needs a communicator: link sluice::gloo", who.world_size));
  return join(who);
}

void check_private_dir(const std::string& dir, std::string_view what) {
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0)
    throw io_error(fmt::format("cannot examine the {} '{}': {}", what, dir, std::strerror(errno)), {dir}, errno);
  if (!S_ISDIR(st.st_mode)) throw config_error(fmt::format("the {} '{}' is not a directory", what, dir));
  const auto mode = st.st_mode & 07777;
  if (st.st_uid != ::geteuid())
    throw config_error(fmt::format("the {} '{}' belongs to uid {}, not to this user (uid {}): whoever owns it could read the "
                                   "load's secret or pose as a rank; use a directory of your own, mode 0700",
                                   what, dir, st.st_uid, ::geteuid()));
  if (mode & 077)
    throw config_error(fmt::format("the {} '{}' has mode {:04o}: others could read the load's secret or pose as a rank; "
                                   "`chmod 700 {}`, or use a fresh directory of mode 0700",
                                   what, dir, mode, dir));
}

void make_private_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<fs::path> missing;
  for (fs::path p = fs::absolute(dir); !p.empty() && !fs::exists(p); p = p.parent_path()) missing.push_back(p);
  // Each one made with mode 0700 by mkdir itself, parents first: made with
  // the umask's mode and closed by a chmod after, another rank making the
  // same directory at the same moment found it existing, checked it
  // between the two and refused it (mode 0755, seen under CPU load).
  for (auto p = missing.rbegin(); p != missing.rend(); ++p) {
    if (::mkdir(p->c_str(), 0700) == 0) {
      ::chmod(p->c_str(), 0700);  // a umask that takes the owner's own bits away
    } else if (errno != EEXIST) {
      const int e = errno;
      throw io_error(fmt::format("cannot create the directory '{}': {}", p->string(), std::strerror(e)), {dir}, e);
    }
  }
}

std::string rank_info::read_password_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw config_error(fmt::format("cannot open the store's password file '{}': {}", path, std::strerror(errno)));
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } c{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    throw config_error(fmt::format("the store's password file '{}' is not a regular file", path));
  if (st.st_uid != ::geteuid())
    throw config_error(fmt::format("the store's password file '{}' belongs to uid {}, not to this user", path, st.st_uid));
  if (st.st_mode & 077)
    throw config_error(fmt::format("the store's password file '{}' has mode {:04o}: others could read it; `chmod 600 {}`", path,
                                   st.st_mode & 07777, path));
  if (st.st_size > 4096) throw config_error(fmt::format("the store's password file '{}' is over 4096 bytes", path));
  std::string pw(static_cast<std::size_t>(st.st_size), '\0');
  if (::read(fd, pw.data(), pw.size()) != static_cast<ssize_t>(pw.size()))
    throw config_error(fmt::format("cannot read the store's password file '{}'", path));
  if (!pw.empty() && pw.back() == '\n') pw.pop_back();
  if (!pw.empty() && pw.back() == '\r') pw.pop_back();
  return pw;
}

}  // namespace sluice::inline v0::comm
