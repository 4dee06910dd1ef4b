// Command-line parsing shared by the example programs: --help prints and exits 0; any other
// parse error (an unknown flag, a bad value, a missing option) is one line on stderr and exit
// code 2, as a usage error should be.
#pragma once

#include <filesystem>
#include <iostream>

#include <CLI/CLI.hpp>

namespace graft::cli {

// -1 when the program should go on, else the exit code.
inline int parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << std::filesystem::path(argv[0]).filename().string() << ": " << e.what() << " (see --help)\n";
    return 2;
  }
}

}  // namespace graft::cli
