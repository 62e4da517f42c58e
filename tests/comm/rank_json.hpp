#pragma once
// The JSON report of a forked rank (multiprocess.hpp): rank r writes
// OUT/rank<r>.json; the parent reads every rank's back, with its exit status
// ("exit") and whether it ran out of time ("timed_out"). A rank that wrote
// nothing reads back as just those two fields.

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "multiprocess.hpp"

namespace sluice_test {

inline std::filesystem::path rank_json_path(const std::filesystem::path& out, std::size_t rank) {
  return out / fmt::format("rank{}.json", rank);
}

inline void write_rank_json(const std::filesystem::path& out, std::size_t rank, const nlohmann::json& j) {
  std::ofstream(rank_json_path(out, rank)) << j.dump();
}

inline std::vector<nlohmann::json> read_rank_jsons(const std::filesystem::path& out, const std::vector<rank_result>& res) {
  std::vector<nlohmann::json> results;
  for (std::size_t r = 0; r < res.size(); ++r) {
    nlohmann::json j;
    std::ifstream f(rank_json_path(out, r));
    if (f) f >> j;
    j["exit"] = res[r].code;
    j["timed_out"] = res[r].timed_out;
    results.push_back(std::move(j));
  }
  return results;
}

}  // namespace sluice_test
