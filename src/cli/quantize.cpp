// tandem quantize: rewrite a GGUF model in another type or llama.cpp type mix.
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "tandem/error.h"
#include "tandem/quantize.h"

namespace tandem::cli {
namespace {

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

std::string types_help() {
  std::string s;
  for (const auto& n : quant::file_type_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

class QuantizeCommand : public Command {
 public:
  explicit QuantizeCommand(CLI::App& app)
      : Command(app.add_subcommand(
            "quantize",
            "Quantize a GGUF model: tandem quantize IN.gguf OUT.gguf TYPE.\n"
            "Types: " +
                types_help() +
                ".\nPer-tensor types follow llama-quantize (output/tied embeddings Q6_K, more bits "
                "for some attn_v/ffn_down layers in the _M mixes); --pure gives every weight "
                "TYPE. Rows whose length is not a multiple of the block size fall back like "
                "llama.cpp (Q4_K->Q5_0, Q5_K->Q5_1, Q6_K->Q8_0, Q2_K/Q3_K->Q4_0 where llama.cpp "
                "uses IQ4_NL, else F16). Already-quantized inputs are dequantized and "
                "re-quantized; tensors already in the target type are copied.")) {
    sub_->add_option("input", in_, "Input GGUF model")->required();
    sub_->add_option("output", out_, "Output GGUF file")->required();
    sub_->add_option("type", type_, "File type (e.g. Q4_K_M, Q8_0)")->required();
    sub_->add_option("-t,--threads", threads_, "Threads (default: all cores)")
        ->check(CLI::Range(0, 1024));
    sub_->add_flag("--pure", pure_, "No type mix: every quantizable weight gets TYPE");
    sub_->add_flag("--verbose", verbose_, "One line per tensor on stderr");
    sub_->add_flag("--json", json_, "Print a JSON summary on stdout");
  }

  int run() override {
    const auto ft = quant::parse_file_type(type_);
    if (!ft) {
      std::fprintf(stderr, "error: unknown type '%s'; supported: %s\n", type_.c_str(),
                   types_help().c_str());
      return 2;
    }
    quant::QuantizeOptions opt;
    opt.file_type = *ft;
    opt.pure = pure_;
    opt.n_threads = threads_;
    const bool tty = stderr_is_tty();
    opt.on_tensor = [&](size_t i, size_t n, const quant::TensorPlan& p, size_t in_b, size_t out_b) {
      if (!p.fallback.empty()) {
        if (tty) std::fprintf(stderr, "\r\033[K");
        std::fprintf(stderr, "fallback: %s: %s\n", p.name.c_str(), p.fallback.c_str());
      }
      if (verbose_) {
        if (tty) std::fprintf(stderr, "\r\033[K");
        std::fprintf(stderr, "[%4zu/%4zu] %-40s %-5s -> %-5s %10s -> %10s%s\n", i + 1, n,
                     p.name.c_str(), std::string(quant::tensor_type_name(p.src_type)).c_str(),
                     std::string(quant::tensor_type_name(p.dst_type)).c_str(), mib(in_b).c_str(),
                     mib(out_b).c_str(), p.quantize ? "" : " (copied)");
      } else if (tty) {
        const int width = 40;
        const int done = static_cast<int>(width * (i + 1) / n);
        std::fprintf(stderr, "\r[%.*s%*s] %zu/%zu %-40.40s", done,
                     "########################################", width - done, "", i + 1, n,
                     p.name.c_str());
        if (i + 1 == n) std::fprintf(stderr, "\n");
      }
      std::fflush(stderr);
    };
    const auto rep = quant::quantize_file(in_, out_, opt);
    std::map<std::string, int> counts;
    for (const auto& p : rep.plans) counts[std::string(quant::tensor_type_name(p.dst_type))]++;
    std::string mix;
    for (const auto& [k, v] : counts) mix += " " + k + "x" + std::to_string(v);
    std::fprintf(stderr,
                 "quantized %s -> %s (%s%s): %d tensors quantized, %d copied, %d fallbacks\n"
                 "  tensors%s\n  file size %s -> %s (%.2f bits per weight), %.2f s\n",
                 in_.c_str(), out_.c_str(), ft->name.c_str(), pure_ ? ", pure" : "",
                 rep.n_quantized, rep.n_copied, rep.n_fallback, mix.c_str(),
                 mib(rep.in_file_bytes).c_str(), mib(rep.out_file_bytes).c_str(),
                 rep.n_params ? 8.0 * rep.out_tensor_bytes / rep.n_params : 0.0, rep.seconds);
    if (json_) {
      nlohmann::json j;
      j["input"] = in_;
      j["output"] = out_;
      j["type"] = ft->name;
      j["file_type"] = ft->llama_ftype;
      j["pure"] = pure_;
      j["in_bytes"] = rep.in_file_bytes;
      j["out_bytes"] = rep.out_file_bytes;
      j["n_params"] = rep.n_params;
      j["bpw"] = rep.n_params ? 8.0 * rep.out_tensor_bytes / rep.n_params : 0.0;
      j["seconds"] = rep.seconds;
      j["tensor_types"] = counts;
      j["fallbacks"] = rep.n_fallback;
      std::printf("%s\n", j.dump().c_str());
    }
    return 0;
  }

 private:
  std::string in_, out_, type_;
  int threads_ = 0;
  bool pure_ = false, verbose_ = false, json_ = false;
};

}  // namespace

std::unique_ptr<Command> make_quantize_command(CLI::App& app) {
  return std::make_unique<QuantizeCommand>(app);
}

}  // namespace tandem::cli
