#pragma once
// Argument parsing of the example tools: CLI11 (a generated --help), errors in
// the one-line convention of cli.hpp. Separate from cli.hpp so that the bench
// programs, which share cli.hpp's helpers, do not need CLI11.

#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli.hpp"

namespace sluice_cli {

/// Parses argv into `app`. Returns nullopt to go on; otherwise the exit code:
/// 0 after printing the help on stdout (--help, -h), or `error_exit` after one
/// stderr line "sluice: error: ... (see --help)" (an unknown option, a missing
/// or malformed value, a positional argument too many).
inline std::optional<int> parse_args(CLI::App& app, int argc, const char* const* argv, int error_exit) {
  // Extras are collected, not thrown: the first one is named in the error line.
  app.allow_extras();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    fail(fmt::format("{} (see --help)", e.what()));
    return error_exit;
  }
  if (const auto extra = app.remaining(); !extra.empty()) {
    fail(fmt::format("unknown argument '{}' (see --help)", extra.front()));
    return error_exit;
  }
  return std::nullopt;
}

}  // namespace sluice_cli
