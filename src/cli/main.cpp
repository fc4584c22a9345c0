// The `tandem` command-line tool: one binary, one subcommand per job.
//
// Contract (the project design, ../shared/DESIGN.md §6, outside this repository): machine-readable
// output is JSON on stdout with --json; human output, progress and errors go to stderr. Exit codes:
// 0 success, 1 runtime error (bad model file, bad input), 2 bad command line.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "tandem/engine.h"
#include "tandem/error.h"

namespace tandem::cli {

namespace {
std::string g_invocation;
}

const std::string& invocation() {
  return g_invocation;
}

bool stderr_is_tty() {
  return isatty(STDERR_FILENO) == 1;
}

std::string read_prompt(const std::string& prompt, const std::string& file, bool have_prompt) {
  if (have_prompt) return prompt;
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw Error("cannot read prompt file '" + file + "'");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  if (isatty(STDIN_FILENO)) {
    throw Error("no prompt: pass -p TEXT, -f FILE, or pipe the text on stdin");
  }
  std::ostringstream ss;
  ss << std::cin.rdbuf();
  return ss.str();
}

}  // namespace tandem::cli

int main(int argc, char** argv) {
  using namespace tandem::cli;
  CLI::App app{"tandem: token-level collaborative decoding between a device and the cloud"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tandem 0.1.0");

  std::vector<std::unique_ptr<Command>> commands;
  commands.push_back(make_tokenize_command(app));
  commands.push_back(make_logits_command(app));
  commands.push_back(make_generate_command(app));
  commands.push_back(make_bench_command(app));
  commands.push_back(make_quantize_command(app));
  commands.push_back(make_perplexity_command(app));
  commands.push_back(make_synth_command(app));
  commands.push_back(make_serve_command(app));
  commands.push_back(make_run_command(app));
  commands.push_back(make_eval_command(app));
  commands.push_back(make_ui_command(app));
  commands.push_back(make_router_command(app));

  for (int i = 0; i < argc; ++i) {
    std::string a = i == 0 ? "tandem" : argv[i];
    if (a.empty() || a.find_first_of(" \t\n'\"$`\\|&;<>()*?!") != std::string::npos) {
      std::string q = "'";
      for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
      a = q + "'";
    }
    g_invocation += (i ? " " : "") + a;
  }
  // llama.cpp's multi-letter short flags, which CLI11 reads as bundles of one-letter ones.
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i) {
    const std::string a = argv[i];
    args.push_back(a == "-ctk" ? "--cache-type-k" : a == "-ctv" ? "--cache-type-v" : a);
  }
  try {
    app.parse(std::move(args));  // CLI11 takes the arguments last first
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  // TANDEM_SIMD_TARGET=AVX2 (say) runs the kernels of that target instead of the best one.
  if (const char* target = std::getenv("TANDEM_SIMD_TARGET")) {
    try {
      tandem::set_simd_target(target);
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "error: TANDEM_SIMD_TARGET: %s\n", e.what());
      return 2;
    }
  }
  for (auto& cmd : commands) {
    if (cmd->parsed()) {
      try {
        return cmd->run();
      } catch (const tandem::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
      } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "error: out of memory\n");
        return 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
      }
    }
  }
  return 2;
}
