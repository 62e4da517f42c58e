#pragma once
// The Redis store's password (private to src/gloo and src/nccl, which link
// hiredis): AUTH once connected, then a PING that says whether the server
// lets this client in. The password is never part of a message.
#include <hiredis/hiredis.h>

#include <string>

#include <fmt/format.h>

#include <sluice/error.hpp>

namespace sluice::inline v0::comm::detail {

// `where`: "redis://host:port", for messages. Throws config_error for a
// missing or refused password, comm_error for another failure.
inline void redis_login(redisContext* c, const std::string& password, const std::string& where) {
  auto run = [c](auto... args) { return static_cast<redisReply*>(::redisCommand(c, args...)); };
  auto text = [](const redisReply* r) { return r && r->str ? std::string(r->str, r->len) : std::string(); };
  if (!password.empty()) {
    redisReply* r = run("AUTH %b", password.data(), password.size());
    const bool ok = r && r->type == REDIS_REPLY_STATUS;
    const auto why = text(r);
    if (r) ::freeReplyObject(r);
    if (!ok)
      throw config_error(fmt::format("the Redis store {} refused the password (SLUICE_STORE_PASSWORD or "
                                     "SLUICE_STORE_PASSWORD_FILE): {}",
                                     where, why.empty() ? std::string("no reply") : why.substr(0, why.find(' '))));
  }
  redisReply* r = run("PING");
  const bool ok = r && r->type != REDIS_REPLY_ERROR;
  const auto why = text(r);
  if (r) ::freeReplyObject(r);
  if (ok) return;
  if (why.rfind("NOAUTH", 0) == 0)
    throw config_error(fmt::format("the Redis store {} requires a password: set SLUICE_STORE_PASSWORD or "
                                   "SLUICE_STORE_PASSWORD_FILE (a file of mode 0600)",
                                   where));
  throw comm_error(fmt::format("the Redis store {} does not answer: {}", where, why.empty() ? std::string("no reply") : why));
}

}  // namespace sluice::inline v0::comm::detail
