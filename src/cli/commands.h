// Subcommands of the `tandem` tool. Each registers its flags on the CLI11 app and runs when
// selected; run() returns the process exit code and throws tandem::Error for runtime failures.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "tandem/default_model.h"
#include "tandem/engine.h"

namespace tandem::cli {

class Command {
 public:
  explicit Command(CLI::App* sub) : sub_(sub) {}
  virtual ~Command() = default;
  bool parsed() const { return sub_->parsed(); }
  virtual int run() = 0;

 protected:
  CLI::App* sub_;
};

std::unique_ptr<Command> make_tokenize_command(CLI::App& app);
std::unique_ptr<Command> make_logits_command(CLI::App& app);
std::unique_ptr<Command> make_generate_command(CLI::App& app);
std::unique_ptr<Command> make_bench_command(CLI::App& app);
std::unique_ptr<Command> make_quantize_command(CLI::App& app);
std::unique_ptr<Command> make_perplexity_command(CLI::App& app);
std::unique_ptr<Command> make_synth_command(CLI::App& app);
std::unique_ptr<Command> make_serve_command(CLI::App& app);
std::unique_ptr<Command> make_run_command(CLI::App& app);
std::unique_ptr<Command> make_eval_command(CLI::App& app);
std::unique_ptr<Command> make_ui_command(CLI::App& app);
std::unique_ptr<Command> make_router_command(CLI::App& app);

// Shared helpers (main.cpp).
// The command line this process was started with, shell-quoted where needed (for result files).
const std::string& invocation();
bool stderr_is_tty();
// The prompt from -p (exactly as given), else -f FILE, else stdin.
std::string read_prompt(const std::string& prompt, const std::string& file, bool have_prompt);
// --cache-type-k / --cache-type-v (llama.cpp's -ctk / -ctv, which main() spells out for CLI11):
// the KV cache's element types, f32 (default) or f16.
void add_kv_cache_flags(CLI::App* sub, KvCacheType& type_k, KvCacheType& type_v);

}  // namespace tandem::cli
