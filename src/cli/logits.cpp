// tandem logits: teacher-forced logits (and hidden states) for a list of token ids.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/model_flag.h"
#include "tandem/engine.h"
#include "tandem/error.h"

namespace tandem::cli {
namespace {

std::vector<TokenId> parse_ids(const std::string& s) {
  std::vector<TokenId> ids;
  std::stringstream ss(s);
  std::string item;
  size_t index = 0;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX) {
      throw Error("--ids: item " + std::to_string(index) + " ('" + item +
                  "') is not a non-negative token id");
    }
    ids.push_back(static_cast<TokenId>(v));
    ++index;
  }
  if (ids.empty()) throw Error("--ids: no token ids given");
  return ids;
}

class LogitsCommand : public Command {
 public:
  explicit LogitsCommand(CLI::App& app)
      : Command(app.add_subcommand("logits", "Teacher-forced logits for a token sequence")) {
    model_flag_.add_to(*sub_, ModelRole::Edge, "GGUF model file");
    sub_->add_option("--ids", ids_, "Comma-separated token ids, evaluated from position 0")
        ->required();
    sub_->add_option("--out", out_, "Write float32 little-endian logits [n_ids x n_vocab]")
        ->required();
    sub_->add_option("--hidden", hidden_,
                     "Also write final hidden states [n_ids x n_embd] (output of the last norm)");
    sub_->add_option("-t,--threads", threads_, "Threads (default: all cores)");
    add_kv_cache_flags(sub_, type_k_, type_v_);
    sub_->add_flag("--f32", f32_,
                   "Dequantize all weights to f32 and compute without activation rounding");
    sub_->add_option("-b,--batch-size", batch_, "Tokens per forward pass")
        ->check(CLI::Range(1, 1 << 16));
  }

  int run() override {
    model_ = model_flag_.resolve(ModelRole::Edge);
    const auto ids = parse_ids(ids_);
    LoadOptions lo;
    lo.dequantize_to_f32 = f32_;
    auto model = Model::load(model_, lo);
    ContextParams cp;
    cp.n_ctx = static_cast<int>(ids.size());
    cp.n_threads = threads_;
    cp.type_k = type_k_;
    cp.type_v = type_v_;
    Context ctx(*model, cp);
    const int V = model->info().n_vocab, D = model->info().n_embd;
    std::ofstream out(out_, std::ios::binary);
    if (!out) throw Error("cannot open --out file '" + out_ + "' for writing");
    std::ofstream hid;
    if (!hidden_.empty()) {
      hid.open(hidden_, std::ios::binary);
      if (!hid) throw Error("cannot open --hidden file '" + hidden_ + "' for writing");
    }
    std::vector<BatchToken> batch;
    for (size_t b = 0; b < ids.size(); b += batch_) {
      const size_t e = std::min(ids.size(), b + static_cast<size_t>(batch_));
      batch.clear();
      for (size_t i = b; i < e; ++i) {
        batch.push_back({ids[i], static_cast<int32_t>(i), 0, true, !hidden_.empty()});
      }
      ctx.decode(batch);
      for (size_t i = 0; i < batch.size(); ++i) {
        const auto l = ctx.logits(static_cast<int>(i));
        out.write(reinterpret_cast<const char*>(l.data()), sizeof(float) * V);
        if (!hidden_.empty()) {
          const auto h = ctx.hidden(static_cast<int>(i));
          hid.write(reinterpret_cast<const char*>(h.data()), sizeof(float) * D);
        }
      }
    }
    out.close();
    if (!out) throw Error("failed writing '" + out_ + "'");
    if (!hidden_.empty()) {
      hid.close();
      if (!hid) throw Error("failed writing '" + hidden_ + "'");
    }
    std::fprintf(stderr, "wrote %zu x %d logits to %s\n", ids.size(), V, out_.c_str());
    return 0;
  }

 private:
  ModelFlag model_flag_;
  std::string model_, ids_, out_, hidden_;
  int threads_ = 0;
  KvCacheType type_k_ = KvCacheType::F32, type_v_ = KvCacheType::F32;
  int batch_ = 512;
  bool f32_ = false;
};

}  // namespace

std::unique_ptr<Command> make_logits_command(CLI::App& app) {
  return std::make_unique<LogitsCommand>(app);
}

}  // namespace tandem::cli
