// tandem synth: a GGUF with the exact shapes of a named real model and random weights, for
// speed measurements at real sizes (src/quantize/synth.h).
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "tandem/error.h"
#include "tandem/quantize.h"

namespace tandem::cli {
namespace {

std::string shape_names() {
  std::string s;
  for (const auto& sh : quant::synth_shapes()) s += (s.empty() ? "" : ", ") + sh.name;
  return s;
}

class SynthCommand : public Command {
 public:
  explicit SynthCommand(CLI::App& app)
      : Command(app.add_subcommand(
            "synth", "Write a random-weight GGUF with the shapes of a real model (" +
                         shape_names() + ") in any type or mix (same rules as tandem quantize)")) {
    sub_->add_option("--shape", shape_, "Model shape: " + shape_names())->required();
    sub_->add_option("--type", type_, "File type, e.g. Q4_K_M, Q8_0, F16")->required();
    sub_->add_option("-o,--output", out_, "Output GGUF file")->required();
    sub_->add_option("--seed", seed_, "Random seed")->capture_default_str();
    sub_->add_option("-t,--threads", threads_, "Threads (default: all cores)")
        ->check(CLI::Range(0, 1024));
    sub_->add_option("--vocab-from", vocab_from_,
                     "Copy the tokenizer.* keys from this GGUF (its token count must equal the "
                     "shape's n_vocab); default: a synthetic SentencePiece vocab");
    sub_->add_flag("--pure", pure_, "No type mix: every weight matrix gets TYPE");
    sub_->add_flag("--json", json_, "Print a JSON summary on stdout");
  }

  int run() override {
    const auto* shape = quant::find_synth_shape(shape_);
    if (!shape) {
      std::fprintf(stderr, "error: unknown shape '%s'; known: %s\n", shape_.c_str(),
                   shape_names().c_str());
      return 2;
    }
    const auto ft = quant::parse_file_type(type_);
    if (!ft) {
      std::fprintf(stderr, "error: unknown type '%s'\n", type_.c_str());
      return 2;
    }
    quant::SynthOptions opt;
    opt.file_type = *ft;
    opt.pure = pure_;
    opt.seed = seed_;
    opt.n_threads = threads_;
    opt.vocab_from = vocab_from_;
    const bool tty = stderr_is_tty();
    opt.on_tensor = [&](size_t i, size_t n, const quant::TensorPlan& p) {
      if (!p.fallback.empty()) {
        if (tty) std::fprintf(stderr, "\r\033[K");
        std::fprintf(stderr, "fallback: %s: %s\n", p.name.c_str(), p.fallback.c_str());
      }
      if (tty) {
        std::fprintf(stderr, "\r[%zu/%zu] %-40.40s", i + 1, n, p.name.c_str());
        if (i + 1 == n) std::fprintf(stderr, "\n");
        std::fflush(stderr);
      }
    };
    const auto rep = quant::write_synth_model(*shape, out_, opt);
    std::map<std::string, int> counts;
    for (const auto& p : rep.plans) counts[std::string(quant::tensor_type_name(p.dst_type))]++;
    std::string mix;
    for (const auto& [k, v] : counts) mix += " " + k + "x" + std::to_string(v);
    std::fprintf(stderr, "wrote %s: %s shape, %s, %.1f M params, %.2f MiB, tensors%s, %.1f s\n",
                 out_.c_str(), shape->name.c_str(), ft->name.c_str(), rep.n_params / 1e6,
                 rep.file_bytes / (1024.0 * 1024.0), mix.c_str(), rep.seconds);
    if (json_) {
      nlohmann::json j;
      j["output"] = out_;
      j["shape"] = shape->name;
      j["type"] = ft->name;
      j["n_params"] = rep.n_params;
      j["bytes"] = rep.file_bytes;
      j["seconds"] = rep.seconds;
      j["tensor_types"] = counts;
      std::printf("%s\n", j.dump().c_str());
    }
    return 0;
  }

 private:
  std::string shape_, type_, out_, vocab_from_;
  uint64_t seed_ = 1;
  int threads_ = 0;
  bool pure_ = false, json_ = false;
};

}  // namespace

std::unique_ptr<Command> make_synth_command(CLI::App& app) {
  return std::make_unique<SynthCommand>(app);
}

}  // namespace tandem::cli
