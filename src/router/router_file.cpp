// Router GGUF files (layout in router_file.h).
#include "router/router_file.h"

#include <cstring>
#include <stdexcept>

#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"

namespace tandem::router {
namespace {

constexpr uint32_t kRouterFileVersion = 1;
constexpr const char* kArch = "tandem-router";

uint64_t fnv1a(uint64_t h, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ull;

std::span<const uint8_t> bytes_of(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)};
}

}  // namespace

void save_router(const std::string& path, const MlpRouterModel& m, const RouterFileInfo& info) {
  m.validate();
  GgufWriter w;
  w.set_string("general.architecture", kArch);
  w.set_string("general.name", "tandem router for " + info.edge_name);
  w.set_u32("tandem_router.version", kRouterFileVersion);
  w.set_string("tandem_router.features", m.spec.describe());
  w.set_u32("tandem_router.n_embd", static_cast<uint32_t>(m.spec.n_embd));
  w.set_u32("tandem_router.top_k", static_cast<uint32_t>(m.spec.top_k));
  w.set_u32("tandem_router.n_layers", static_cast<uint32_t>(m.layers.size()));
  w.set_string("tandem_router.activation", "relu");
  w.set_string("tandem_router.edge.vocab_hash", info.vocab_hash);
  w.set_u32("tandem_router.edge.n_vocab", info.n_vocab);
  w.set_string("tandem_router.edge.name", info.edge_name);
  if (!info.cloud_name.empty()) w.set_string("tandem_router.cloud.name", info.cloud_name);
  w.set_string("tandem_router.label", info.label);
  w.set_string("tandem_router.training", info.training_json);
  w.set_array("tandem_router.calibration.threshold", m.calib_threshold);
  w.set_array("tandem_router.calibration.share", m.calib_share);

  uint64_t hash = kFnvBasis;
  auto add = [&](const std::string& name, const std::vector<float>& data, int64_t ne0,
                 int64_t ne1) {
    const int64_t ne2[2] = {ne0, ne1};
    const auto bytes = bytes_of(data);
    w.add_tensor(name, TensorType::F32, std::span<const int64_t>(ne2, ne1 > 1 ? 2 : 1), bytes);
    hash = fnv1a(hash, bytes.data(), bytes.size());
  };
  add("feature.mean", m.mean, static_cast<int64_t>(m.mean.size()), 1);
  add("feature.scale", m.scale, static_cast<int64_t>(m.scale.size()), 1);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const MlpLayer& L = m.layers[l];
    add("layer." + std::to_string(l) + ".weight", L.weight, L.n_in, L.n_out);
    add("layer." + std::to_string(l) + ".bias", L.bias, L.n_out, 1);
  }
  w.set_u64("tandem_router.weights_hash", hash);
  w.write(path);
}

namespace {

// What the steps of load_router share: the open file, its path (which starts every error
// message) and the FNV-1a hash of the weight tensors read so far, in file order.
struct RouterReader {
  const GgufFile& f;
  const std::string& path;
  uint64_t hash = kFnvBasis;

  Error fail(const std::string& what) const { return Error(path + ": " + what); }

  // An F32 tensor of shape [ne0] (ne1 == 1) or [ne0, ne1], copied out and added to the hash.
  std::vector<float> tensor(const std::string& name, int64_t ne0, int64_t ne1) {
    const GgufTensorInfo* t = f.find_tensor(name);
    if (!t) throw fail("tensor '" + name + "' is missing");
    if (t->type != TensorType::F32 || t->ne[0] != ne0 || t->n_rows() != ne1) {
      throw fail("tensor '" + name + "' is " + t->shape_string() + ", expected [" +
                 std::to_string(ne0) + (ne1 > 1 ? ", " + std::to_string(ne1) : "") + "] F32");
    }
    std::vector<float> v(static_cast<size_t>(ne0 * ne1));
    std::memcpy(v.data(), t->data, v.size() * sizeof(float));
    hash = fnv1a(hash, t->data, v.size() * sizeof(float));
    return v;
  }
};

// general.architecture and the file version: is this a router file this build reads?
void check_kind(const RouterReader& r) {
  const auto arch = r.f.get_string_opt("general.architecture");
  if (!arch || *arch != kArch) {
    throw r.fail("not a tandem router (general.architecture is '" +
                 std::string(arch ? *arch : "<missing>") + "', expected '" + kArch + "')");
  }
  const uint64_t version = r.f.get_u64("tandem_router.version");
  if (version != kRouterFileVersion) {
    throw r.fail("router file version " + std::to_string(version) + " (this build reads " +
                 std::to_string(kRouterFileVersion) + ")");
  }
}

// The feature spec into m and the edge model's identity into info; returns the layer count
// (checked later, with the weights).
uint64_t read_metadata(const GgufFile& f, MlpRouterModel& m, RouterFileInfo& info) {
  m.spec.n_embd = static_cast<int>(f.get_u64("tandem_router.n_embd"));
  m.spec.top_k = static_cast<int>(f.get_u64("tandem_router.top_k"));
  const uint64_t n_layers = f.get_u64("tandem_router.n_layers");
  info.vocab_hash = std::string(f.get_string("tandem_router.edge.vocab_hash"));
  info.n_vocab = static_cast<uint32_t>(f.get_u64("tandem_router.edge.n_vocab"));
  info.edge_name = std::string(f.get_string_opt("tandem_router.edge.name").value_or(""));
  info.cloud_name = std::string(f.get_string_opt("tandem_router.cloud.name").value_or(""));
  info.label = std::string(f.get_string_opt("tandem_router.label").value_or(""));
  info.training_json = std::string(f.get_string_opt("tandem_router.training").value_or(""));
  return n_layers;
}

// The router must have been trained for this edge model (vocabulary, width) and compute the
// features this build computes.
void check_fits(const RouterReader& r, const RouterExpectations& expect, const MlpRouterModel& m,
                const RouterFileInfo& info) {
  const std::string for_model = expect.edge_path.empty() ? "the edge model" : expect.edge_path;
  if (!expect.vocab_hash.empty() && expect.vocab_hash != info.vocab_hash) {
    throw r.fail("this router was trained for another model: its vocabulary hash is " +
                 info.vocab_hash + " ('" + info.edge_name + "'), " + for_model + "'s is " +
                 expect.vocab_hash);
  }
  if (expect.n_vocab && expect.n_vocab != info.n_vocab) {
    throw r.fail("this router was trained for another model: n_vocab " +
                 std::to_string(info.n_vocab) + ", " + for_model + " has " +
                 std::to_string(expect.n_vocab));
  }
  if (expect.n_embd && expect.n_embd != m.spec.n_embd) {
    throw r.fail("this router was trained for another model: hidden width (n_embd) " +
                 std::to_string(m.spec.n_embd) + ", " + for_model + " has " +
                 std::to_string(expect.n_embd));
  }
  const std::string features(r.f.get_string("tandem_router.features"));
  if (features != m.spec.describe()) {
    throw r.fail("feature spec '" + features + "' is not the one this build computes ('" +
                 m.spec.describe() + "')");
  }
}

// Standardisation [F] and n_layers layers (layer l's weight [n_in][n_out], n_in the previous
// layer's n_out), then the stored hash of all of them.
void read_weights(RouterReader& r, uint64_t n_layers, MlpRouterModel& m) {
  const int F = m.spec.n_features();
  if (n_layers < 1 || n_layers > 8) throw r.fail(std::to_string(n_layers) + " layers (1..8)");
  m.mean = r.tensor("feature.mean", F, 1);
  m.scale = r.tensor("feature.scale", F, 1);
  int n_in = F;
  for (uint64_t l = 0; l < n_layers; ++l) {
    const std::string base = "layer." + std::to_string(l);
    const GgufTensorInfo* t = r.f.find_tensor(base + ".weight");
    if (!t) throw r.fail("tensor '" + base + ".weight' is missing");
    MlpLayer L;
    L.n_in = n_in;
    L.n_out = static_cast<int>(t->n_rows());
    if (L.n_out < 1 || L.n_out > 4096) throw r.fail("tensor '" + base + ".weight' has bad shape");
    L.weight = r.tensor(base + ".weight", n_in, L.n_out);
    L.bias = r.tensor(base + ".bias", L.n_out, 1);
    n_in = L.n_out;
    m.layers.push_back(std::move(L));
  }
  const uint64_t stored = r.f.get_u64("tandem_router.weights_hash");
  if (stored != r.hash) {
    throw r.fail("the weights are damaged: tandem_router.weights_hash is " +
                 std::to_string(stored) + ", the tensors hash to " + std::to_string(r.hash));
  }
}

}  // namespace

LoadedRouter load_router(const std::string& path, const RouterExpectations& expect) {
  const auto f = GgufFile::open(path);
  RouterReader r{*f, path};
  check_kind(r);
  LoadedRouter out;
  auto m = std::make_shared<MlpRouterModel>();
  const uint64_t n_layers = read_metadata(*f, *m, out.info);
  check_fits(r, expect, *m, out.info);
  read_weights(r, n_layers, *m);
  m->calib_threshold = f->get_f32_array("tandem_router.calibration.threshold");
  m->calib_share = f->get_f32_array("tandem_router.calibration.share");
  try {
    m->validate();
  } catch (const std::invalid_argument& e) {
    throw r.fail(e.what());
  }
  out.model = std::move(m);
  return out;
}

}  // namespace tandem::router
