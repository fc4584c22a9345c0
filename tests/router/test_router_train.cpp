// Learned routers: traces, training, router GGUF files, the mlp policy with its controller.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "common/error.h"
#include "gguf/gguf_writer.h"
#include "router/router_file.h"
#include "router/trace.h"
#include "router/train.h"
#include "tandem/router.h"
#include "tandem/router_mlp.h"

namespace tandem::router {
namespace {

namespace fs = std::filesystem;

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("tandem-router-" + std::to_string(::getpid()) + "-" + name);
}

TraceHeader small_header() {
  TraceHeader h;
  h.n_embd = 6;
  h.top_k = 3;
  h.n_vocab = 100;
  h.vocab_fingerprint = 0x1234abcd5678ef00ull;
  h.model_name = "synthetic";
  return h;
}

// A synthetic trace whose "gain" and "disagree" depend on the hidden state's first two values
// (a linearly separable rule plus a little noise elsewhere): a router must find it.
TraceFile synthetic_trace(int n_seq, int per_seq, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  TraceFile tf;
  tf.header = small_header();
  for (int s = 0; s < n_seq; ++s) {
    TraceSequence seq;
    seq.id = static_cast<uint64_t>(s);
    for (int i = 0; i < per_seq; ++i) {
      TraceRecord r;
      r.position = i;
      for (uint32_t d = 0; d < tf.header.n_embd; ++d) r.hidden.push_back(nd(rng));
      const bool hard = r.hidden[0] + 0.5f * r.hidden[1] > 1.2f;  // ~12% of rows
      r.log_top = {-0.5f, -1.5f, -2.5f};
      r.entropy = 1.0f + 0.1f * nd(rng);
      r.margin = 0.3f;
      r.edge_top1 = 7;
      r.cloud_top1 = hard ? 9 : 7;
      r.true_token = 9;
      r.edge_lp_true = hard ? -6.0f : -2.0f;
      r.cloud_lp_true = hard ? -1.0f : -2.1f;
      r.cloud_lp_edge = hard ? -5.0f : -0.3f;
      r.kl_cloud_edge = hard ? 2.0f : 0.1f;
      r.outcome = hard ? 0.5f + 0.1f * nd(rng) : 0.0f;
      r.flags = static_cast<uint32_t>(i % 3);
      seq.records.push_back(std::move(r));
    }
    tf.sequences.push_back(std::move(seq));
  }
  return tf;
}

std::vector<uint8_t> encode(const TraceFile& tf) {
  std::vector<uint8_t> out = encode_trace_header(tf.header);
  for (const auto& s : tf.sequences) {
    const auto b = encode_trace_sequence(tf.header, s);
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(RouterTrace, RoundTripsEveryField) {
  const TraceFile tf = synthetic_trace(3, 5, 1);
  const auto bytes = encode(tf);
  EXPECT_EQ(bytes.size(), encode_trace_header(tf.header).size() +
                              3 * (16 + 5 * trace_record_bytes(tf.header) + 8));
  const TraceFile back = parse_trace(bytes.data(), bytes.size(), "mem");
  EXPECT_EQ(back.header, tf.header);
  ASSERT_EQ(back.sequences.size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    ASSERT_EQ(back.sequences[s].records.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      const TraceRecord &a = tf.sequences[s].records[i], &b = back.sequences[s].records[i];
      EXPECT_EQ(a.position, b.position);
      EXPECT_EQ(a.edge_top1, b.edge_top1);
      EXPECT_EQ(a.cloud_top1, b.cloud_top1);
      EXPECT_EQ(a.true_token, b.true_token);
      EXPECT_EQ(a.cloud_lp_edge, b.cloud_lp_edge);
      EXPECT_EQ(a.cloud_lp_true, b.cloud_lp_true);
      EXPECT_EQ(a.edge_lp_true, b.edge_lp_true);
      EXPECT_EQ(a.entropy, b.entropy);
      EXPECT_EQ(a.margin, b.margin);
      EXPECT_EQ(a.kl_cloud_edge, b.kl_cloud_edge);
      EXPECT_EQ(a.outcome, b.outcome);
      EXPECT_EQ(a.flags, b.flags);
      EXPECT_EQ(a.log_top, b.log_top);
      EXPECT_EQ(a.hidden, b.hidden);
    }
  }
}

// Version 1 files (no outcome field) still read, every outcome NaN; they are written the same
// way when the header says version 1.
TEST(RouterTrace, ReadsVersionOneWithoutOutcome) {
  TraceFile tf = synthetic_trace(2, 4, 5);
  tf.header.version = 1;
  const auto bytes = encode(tf);
  EXPECT_EQ(trace_record_bytes(tf.header) + 4, trace_record_bytes(small_header()));
  const TraceFile back = parse_trace(bytes.data(), bytes.size(), "v1");
  EXPECT_EQ(back.header.version, 1u);
  ASSERT_EQ(back.n_records(), 8u);
  for (size_t s = 0; s < 2; ++s)
    for (size_t i = 0; i < 4; ++i) {
      const TraceRecord &a = tf.sequences[s].records[i], &b = back.sequences[s].records[i];
      EXPECT_TRUE(std::isnan(b.outcome));
      EXPECT_EQ(a.flags, b.flags);
      EXPECT_EQ(a.kl_cloud_edge, b.kl_cloud_edge);
      EXPECT_EQ(a.hidden, b.hidden);
    }
}

TEST(RouterTrace, TruncatedFileNamesTheOffset) {
  const auto bytes = encode(synthetic_trace(2, 4, 2));
  const size_t cut = bytes.size() - 10;  // inside the last sequence
  const std::string e = error_of([&] { parse_trace(bytes.data(), cut, "t.bin"); });
  EXPECT_NE(e.find("t.bin: byte offset "), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  // Resuming reads the whole sequences before the tail and says where they end.
  size_t valid = 0;
  TraceReadOptions ro;
  ro.allow_truncated_tail = true;
  const TraceFile part = parse_trace(bytes.data(), cut, "t.bin", ro, &valid);
  EXPECT_EQ(part.sequences.size(), 1u);
  EXPECT_EQ(valid, encode_trace_header(small_header()).size() + 16 +
                       4 * trace_record_bytes(small_header()) + 8);
  // A header cut short is an error too.
  EXPECT_NE(error_of([&] { parse_trace(bytes.data(), 20, "t.bin"); }).find("offset 20"),
            std::string::npos);
}

TEST(RouterTrace, DamagedBytesAreFoundAndNamed) {
  auto bytes = encode(synthetic_trace(2, 4, 3));
  const size_t header = encode_trace_header(small_header()).size();
  // A flipped bit inside a record's hidden state: the sequence hash catches it.
  auto flipped = bytes;
  flipped[header + 16 + 60] ^= 0x10;
  std::string e = error_of([&] { parse_trace(flipped.data(), flipped.size(), "d.bin"); });
  EXPECT_NE(e.find("damaged"), std::string::npos) << e;
  EXPECT_NE(e.find("sequence 0"), std::string::npos) << e;
  // A wrong sequence tag names its offset and what was expected.
  auto bad_tag = bytes;
  bad_tag[header] = 'X';
  e = error_of([&] { parse_trace(bad_tag.data(), bad_tag.size(), "d.bin"); });
  EXPECT_NE(e.find("offset " + std::to_string(header)), std::string::npos) << e;
  EXPECT_NE(e.find("SEQ1"), std::string::npos) << e;
  // A huge record count does not allocate: it is refused as running past the end.
  auto huge = bytes;
  const uint32_t big = 0x7fffffff;
  std::memcpy(huge.data() + header + 12, &big, 4);
  e = error_of([&] { parse_trace(huge.data(), huge.size(), "d.bin"); });
  EXPECT_NE(e.find("offset " + std::to_string(header + 12)), std::string::npos) << e;
  // Another format version and garbage magic.
  auto v3 = bytes;
  v3[12] = 3;
  EXPECT_NE(error_of([&] { parse_trace(v3.data(), v3.size(), "d.bin"); }).find("version 3"),
            std::string::npos);
  auto magic = bytes;
  magic[0] = 'G';
  EXPECT_NE(error_of([&] { parse_trace(magic.data(), magic.size(), "d.bin"); }).find("magic"),
            std::string::npos);
}

TEST(RouterTrace, WriterResumesCuttingAHalfWrittenTail) {
  const fs::path p = temp_path("resume.bin");
  const TraceFile tf = synthetic_trace(3, 4, 4);
  {
    TraceWriter w(p.string(), tf.header, false);
    w.append(tf.sequences[0]);
    w.append(tf.sequences[1]);
  }
  // A crash half-way through sequence 2.
  {
    const auto tail = encode_trace_sequence(tf.header, tf.sequences[2]);
    std::ofstream f(p, std::ios::binary | std::ios::app);
    f.write(reinterpret_cast<const char*>(tail.data()), 37);
  }
  EXPECT_THROW(read_trace(p.string()), Error);
  {
    TraceWriter w(p.string(), tf.header, true);
    EXPECT_TRUE(w.has(0));
    EXPECT_TRUE(w.has(1));
    EXPECT_FALSE(w.has(2));
    EXPECT_EQ(w.cut_bytes(), 37u);
    w.append(tf.sequences[2]);
  }
  const TraceFile back = read_trace(p.string());
  ASSERT_EQ(back.sequences.size(), 3u);
  EXPECT_EQ(back.sequences[2].id, 2u);
  // Resuming with another model's header is refused, naming the field.
  TraceHeader other = tf.header;
  other.n_embd = 7;
  const std::string e = error_of([&] { TraceWriter w(p.string(), other, true); });
  EXPECT_NE(e.find("n_embd"), std::string::npos) << e;
  fs::remove(p);
}

TEST(RouterLabels, ParseAndMeaning) {
  EXPECT_EQ(parse_label("disagree").kind, LabelKind::Disagree);
  EXPECT_EQ(parse_label("critical").tau, -2.0);
  EXPECT_EQ(parse_label("critical:-1.5").tau, -1.5);
  EXPECT_EQ(parse_label("gain").kind, LabelKind::Gain);
  EXPECT_EQ(parse_label("gain:0.1").kind, LabelKind::GainTop);
  EXPECT_THROW(parse_label("gain:2"), std::invalid_argument);
  EXPECT_THROW(parse_label("critical:x"), std::invalid_argument);
  EXPECT_EQ(parse_label("outcome").kind, LabelKind::Outcome);
  EXPECT_EQ(parse_label("outcome").tau, 0.25);
  EXPECT_EQ(parse_label("outcome:0.5").tau, 0.5);
  EXPECT_EQ(parse_label("outcome:0.5").describe(), "outcome:0.5");
  EXPECT_THROW(parse_label("outcome:0"), std::invalid_argument);
  EXPECT_THROW(parse_label("outcome:x"), std::invalid_argument);
  EXPECT_EQ(parse_label("fixes").kind, LabelKind::Fixes);
  EXPECT_THROW(parse_label("fixes:1"), std::invalid_argument);
  const TraceFile tf = synthetic_trace(2, 50, 5);
  // outcome: positives at or above TAU; a sequence whose outcome was not measured is left out.
  {
    TraceFile t2 = tf;
    for (auto& r : t2.sequences[1].records) r.outcome = std::nanf("");
    const Dataset d = make_dataset(t2, parse_label("outcome:0.4"), 0);
    ASSERT_EQ(d.n(), 50u);
    for (size_t i = 0; i < d.n(); ++i) {
      EXPECT_EQ(d.seq[i], 0u);
      EXPECT_EQ(d.y[i], tf.sequences[0].records[i].outcome >= 0.4f ? 1.0f : 0.0f);
    }
  }
  // fixes: the cloud right where the edge is wrong; the other three cases are negatives.
  {
    TraceFile t4 = tf;
    auto& rs = t4.sequences[0].records;
    rs.resize(4);
    const int tr = 9, other = 7;
    const int edge[4] = {other, tr, other, tr}, cloud[4] = {tr, other, other, tr};
    for (int i = 0; i < 4; ++i) {
      rs[i].true_token = tr;
      rs[i].edge_top1 = edge[i];
      rs[i].cloud_top1 = cloud[i];
    }
    t4.sequences.resize(1);
    const Dataset fx = make_dataset(t4, parse_label("fixes"));
    EXPECT_EQ(fx.y, (std::vector<float>{1, 0, 0, 0}));
  }
  const Dataset dis = make_dataset(tf, parse_label("disagree"));
  const Dataset crit = make_dataset(tf, parse_label("critical:-2"));
  const Dataset gain = make_dataset(tf, parse_label("gain"));
  ASSERT_EQ(dis.n(), 100u);
  for (size_t i = 0; i < dis.n(); ++i) {
    const bool hard = dis.gain[i] > 0;
    EXPECT_EQ(dis.y[i], hard ? 1.0f : 0.0f);
    EXPECT_EQ(crit.y[i], hard ? 1.0f : 0.0f);
    EXPECT_NEAR(gain.y[i], hard ? 5.0f : -0.1f, 1e-5);
  }
}

TEST(RouterMetrics, AucOfKnownOrders) {
  EXPECT_DOUBLE_EQ(roc_auc({0.1f, 0.2f, 0.8f, 0.9f}, {0, 0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(roc_auc({0.9f, 0.8f, 0.2f, 0.1f}, {0, 0, 1, 1}), 0.0);
  EXPECT_DOUBLE_EQ(roc_auc({0.5f, 0.5f, 0.5f, 0.5f}, {0, 1, 0, 1}), 0.5);
  EXPECT_DOUBLE_EQ(pr_auc({0.1f, 0.2f, 0.8f, 0.9f}, {0, 0, 1, 1}), 1.0);
  // Positives ranked 1st and 3rd: precision 1 and 2/3.
  EXPECT_NEAR(pr_auc({0.9f, 0.8f, 0.7f, 0.1f}, {1, 0, 1, 0}), (1 + 2.0 / 3) / 2, 1e-12);
}

TrainOptions quick_options() {
  TrainOptions o;
  o.epochs = 25;
  o.patience = 5;
  o.lr = 3e-3;
  o.verbose = false;
  return o;
}

TEST(RouterTrain, SeparableDataReachesRocAucAbove099) {
  const TraceFile tf = synthetic_trace(20, 200, 6);
  for (const char* label : {"disagree", "gain"}) {
    SCOPED_TRACE(label);
    const LabelSpec spec = parse_label(label);
    const TrainResult r = train_router(make_dataset(tf, spec), spec, quick_options());
    EXPECT_EQ(r.n_val_seq, 4u);
    EXPECT_EQ(r.n_val, 800u) << "the validation split is by whole sequences";
    EXPECT_GT(r.val.roc_auc, 0.99);
    EXPECT_GT(r.val.pr_auc, 0.9);
    // Routing by the score recovers (nearly) what the oracle does at the positives' share.
    EXPECT_GT(r.val.gap_recovered[5], 0.95 * r.val.oracle_gap_recovered[5]);
    // The calibration table: ascending thresholds, descending shares from ~1 to 0.
    ASSERT_GE(r.model.calib_threshold.size(), 2u);
    EXPECT_TRUE(std::is_sorted(r.model.calib_threshold.begin(), r.model.calib_threshold.end()));
    EXPECT_GT(r.model.calib_share.front(), 0.95f);
    EXPECT_EQ(r.model.calib_share.back(), 0.0f);
  }
}

TEST(RouterTrain, SameSeedSameModel) {
  const TraceFile tf = synthetic_trace(6, 60, 7);
  const LabelSpec spec = parse_label("disagree");
  TrainOptions o = quick_options();
  o.epochs = 3;
  const TrainResult a = train_router(make_dataset(tf, spec), spec, o);
  const TrainResult b = train_router(make_dataset(tf, spec), spec, o);
  EXPECT_EQ(a.model.layers[0].weight, b.model.layers[0].weight);
  o.seed = 2;
  const TrainResult c = train_router(make_dataset(tf, spec), spec, o);
  EXPECT_NE(a.model.layers[0].weight, c.model.layers[0].weight);
}

// The cloud-aware reference (`router train --cloud-aware-reference`): when the hard positions
// show only on the cloud's side, the router's features cannot find them and the reference's
// three cloud columns can, on the same split.
TEST(RouterTrain, CloudColumnsSeeWhatTheEdgeCannot) {
  TraceFile tf = synthetic_trace(20, 200, 8);
  std::mt19937_64 rng(9);
  std::normal_distribution<float> nd(0, 1);
  for (auto& s : tf.sequences)
    for (auto& r : s.records)
      for (float& h : r.hidden) h = nd(rng);  // the edge's view no longer tells the hard rows
  const LabelSpec gain = parse_label("gain");
  const Dataset edge_only = make_dataset(tf, gain);
  const Dataset with_cloud = make_dataset(tf, gain, 0, true);
  ASSERT_EQ(with_cloud.width(), edge_only.width() + 3);
  const TraceRecord& r0 = tf.sequences[0].records[0];
  const float* c = &with_cloud.x[static_cast<size_t>(edge_only.width())];
  EXPECT_EQ(c[0], r0.kl_cloud_edge);
  EXPECT_EQ(c[1], r0.cloud_lp_edge);
  EXPECT_EQ(c[2], r0.edge_top1 == r0.cloud_top1 ? 1.0f : 0.0f);
  const TrainResult blind = train_router(edge_only, gain, quick_options());
  const TrainResult aware = train_router(with_cloud, gain, quick_options());
  EXPECT_EQ(blind.n_val, aware.n_val) << "the same split by sequence";
  EXPECT_LT(blind.val.roc_auc, 0.7);
  EXPECT_GT(aware.val.roc_auc, 0.99);
}

MlpRouterModel trained_model(const TraceFile& tf) {
  const LabelSpec spec = parse_label("gain");
  TrainOptions o = quick_options();
  o.hidden = {16, 8};
  return train_router(make_dataset(tf, spec), spec, o).model;
}

RouterFileInfo info_for(const TraceHeader& h) {
  RouterFileInfo info;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h.vocab_fingerprint));
  info.vocab_hash = hex;
  info.n_vocab = h.n_vocab;
  info.edge_name = h.model_name;
  info.label = "gain";
  info.training_json = "{}";
  return info;
}

// The signal the edge decoder would hand the router at a traced position.
RouterSignal signal_of(const TraceRecord& r) {
  RouterSignal s;
  s.position = r.position;
  for (float lp : r.log_top) s.top_probs.push_back(std::exp(lp));
  s.entropy = r.entropy;
  s.margin = r.margin;
  s.hidden = r.hidden;
  return s;
}

TEST(RouterFile, RoundTripsAndScoresTheSame) {
  const TraceFile tf = synthetic_trace(6, 80, 8);
  const MlpRouterModel m = trained_model(tf);
  const fs::path p = temp_path("r.gguf");
  const RouterFileInfo info = info_for(tf.header);
  save_router(p.string(), m, info);
  RouterExpectations expect;
  expect.vocab_hash = info.vocab_hash;
  expect.n_vocab = info.n_vocab;
  expect.n_embd = 6;
  const LoadedRouter back = load_router(p.string(), expect);
  EXPECT_EQ(back.info.label, "gain");
  EXPECT_EQ(back.model->layers.size(), 3u);
  // The same score from features and from a RouterSignal built like the edge decoder's.
  const TraceRecord& r = tf.sequences[0].records[3];
  const RouterSignal s = signal_of(r);
  std::vector<float> x(m.spec.n_features());
  router_features(m.spec, r.hidden, r.log_top, r.entropy, r.margin, r.position, x.data());
  EXPECT_NEAR(back.model->score(s), m.score_features(x.data()), 1e-5);
  fs::remove(p);
}

TEST(RouterFile, RefusesAnotherModelAndDamage) {
  const TraceFile tf = synthetic_trace(4, 60, 9);
  const MlpRouterModel m = trained_model(tf);
  const fs::path p = temp_path("refuse.gguf");
  const RouterFileInfo info = info_for(tf.header);
  save_router(p.string(), m, info);

  RouterExpectations other;
  other.vocab_hash = "00000000000000ff";
  other.edge_path = "other.gguf";
  std::string e = error_of([&] { load_router(p.string(), other); });
  EXPECT_NE(e.find("another model"), std::string::npos) << e;
  EXPECT_NE(e.find(info.vocab_hash), std::string::npos) << e;
  EXPECT_NE(e.find("00000000000000ff"), std::string::npos) << e;
  RouterExpectations wide;
  wide.n_embd = 640;
  e = error_of([&] { load_router(p.string(), wide); });
  EXPECT_NE(e.find("n_embd"), std::string::npos) << e;
  EXPECT_NE(e.find("640"), std::string::npos) << e;

  // Flip a byte in the tensor data (the file's tail): the weights hash catches it.
  std::vector<char> bytes(fs::file_size(p));
  std::ifstream(p, std::ios::binary).read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  const fs::path q = temp_path("damaged.gguf");
  auto write = [&](const std::vector<char>& b) {
    std::ofstream(q, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
  };
  auto damaged = bytes;
  damaged[damaged.size() - 40] ^= 0x5a;
  write(damaged);
  e = error_of([&] { load_router(q.string()); });
  EXPECT_NE(e.find("damaged"), std::string::npos) << e;
  // Truncated: the GGUF reader names the offset.
  write(std::vector<char>(bytes.begin(), bytes.begin() + bytes.size() / 2));
  e = error_of([&] { load_router(q.string()); });
  EXPECT_FALSE(e.empty());
  EXPECT_NE(e.find(q.string()), std::string::npos) << e;
  // A model file is not a router.
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.write(q.string());
  e = error_of([&] { load_router(q.string()); });
  EXPECT_NE(e.find("not a tandem router"), std::string::npos) << e;
  fs::remove(p);
  fs::remove(q);
}

TEST(RouterMlpPolicy, ControllerHoldsTheTargetOnHeldOutTraces) {
  // Train on some sequences, then run the mlp policy online over others (as on a device): the
  // realised share stays within one point of every target, starting from the calibration.
  const TraceFile train = synthetic_trace(10, 200, 10);
  const TraceFile held_out = synthetic_trace(10, 300, 11);
  auto model = std::make_shared<MlpRouterModel>(trained_model(train));
  for (double target : {0.02, 0.05, 0.07, 0.1, 0.2}) {
    SCOPED_TRACE(target);
    RouterConfig c;
    c.policy = RouterPolicy::Mlp;
    c.mlp = model;
    c.target_rate = target;
    c.prior_scores = model->prior_scores(c.window);
    Router router(c);
    int n = 0, cloud = 0;
    for (const auto& seq : held_out.sequences) {
      for (const auto& r : seq.records) {
        const RouteDecision d = router.decide(signal_of(r));
        router.record(d.cloud, 1);
        ++n;
        cloud += d.cloud;
      }
    }
    EXPECT_NEAR(static_cast<double>(cloud) / n, target, 0.01);
  }
}

TEST(RouterMlpPolicy, NeedsAModelAndTheHiddenState) {
  RouterConfig c;
  c.policy = RouterPolicy::Mlp;
  EXPECT_THROW(Router r(c), std::invalid_argument);
  c.mlp = std::make_shared<MlpRouterModel>(trained_model(synthetic_trace(3, 40, 12)));
  Router r(c);
  RouterSignal s;
  s.top_probs = {0.5f, 0.2f, 0.1f};
  EXPECT_THROW(r.decide(s), std::invalid_argument) << "no hidden state";
  EXPECT_EQ(router_policy_name(RouterPolicy::Mlp), "mlp");
}

}  // namespace
}  // namespace tandem::router
