// `router train` as a library call (tandem/router_train.h): traces in, a router GGUF file and
// its training summary out, the validation curves printed on stderr.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/error.h"
#include "router/router_file.h"
#include "router/trace.h"
#include "router/train.h"
#include "tandem/router_train.h"
#include "tandem/vocab.h"  // fingerprint_hex

namespace tandem::router {
namespace {

using json = nlohmann::json;

// The traces as one: the sequences of all, under the first one's header (which the others must
// match but for their version: versions 1 and 2 hold the same features).
TraceFile read_traces(const std::vector<std::string>& paths) {
  TraceFile trace = read_trace(paths[0]);
  for (size_t i = 1; i < paths.size(); ++i) {
    TraceFile more = read_trace(paths[i]);
    TraceHeader h = more.header;
    h.version = trace.header.version;
    if (!(h == trace.header)) {
      throw Error(paths[i] + ": its header (model, n_embd, top_k, vocabulary) differs from " +
                  paths[0] + "'s");
    }
    for (auto& s : more.sequences) trace.sequences.push_back(std::move(s));
  }
  return trace;
}

// Prints the validation result and its share curves on stderr and returns the curves as JSON
// (`aware`: the cloud-aware reference's gap recovered per share, or empty).
json report_curves(const TrainResult& r, const LabelSpec& label, const std::vector<double>& aware,
                   bool cloud_aware) {
  const Metrics& m = r.val;
  std::fprintf(stderr,
               "[train] best epoch %d of %d; validation: %zu positions in %zu sequences, "
               "ROC-AUC %.4f, PR-AUC %.4f (positive rate %.3f%s)\n",
               r.best_epoch, r.epochs_run, r.n_val, r.n_val_seq, m.roc_auc, m.pr_auc,
               m.positive_rate, label.regression() ? ", positives: the top 10% by gain" : "");
  std::fprintf(stderr,
               "  cloud share | recall | gap recovered | oracle | of the oracle | by the "
               "recorded KL | entropy policy%s\n",
               cloud_aware ? " | cloud-aware reference" : "");
  json curve = json::array();
  for (size_t i = 0; i < m.shares.size(); ++i) {
    const double of =
        m.oracle_gap_recovered[i] > 0 ? m.gap_recovered[i] / m.oracle_gap_recovered[i] : 0.0;
    std::fprintf(stderr,
                 "  %10.0f%% | %5.1f%% | %12.1f%% | %5.1f%% | %12.0f%% | %17.1f%% | %13.1f%%",
                 100 * m.shares[i], 100 * m.recall[i], 100 * m.gap_recovered[i],
                 100 * m.oracle_gap_recovered[i], 100 * of,
                 i < m.kl_gap_recovered.size() ? 100 * m.kl_gap_recovered[i] : NAN,
                 100 * r.val_entropy.gap_recovered[i]);
    if (i < aware.size()) std::fprintf(stderr, " | %21.1f%%", 100 * aware[i]);
    std::fputc('\n', stderr);
    curve.push_back({{"share", m.shares[i]},
                     {"recall", m.recall[i]},
                     {"gap_recovered", m.gap_recovered[i]},
                     {"oracle_gap_recovered", m.oracle_gap_recovered[i]},
                     {"entropy_gap_recovered", r.val_entropy.gap_recovered[i]}});
    if (i < m.kl_gap_recovered.size()) curve.back()["kl_gap_recovered"] = m.kl_gap_recovered[i];
    if (i < aware.size()) curve.back()["cloud_aware_gap_recovered"] = aware[i];
  }
  return curve;
}

json summary_json(const RouterTraining& t, const LabelSpec& label, const Dataset& data,
                  const TrainResult& r, json curve) {
  const Metrics& m = r.val;
  return {{"traces", t.traces},
          {"label", label.describe()},
          {"positions", data.n()},
          {"train_positions", r.n_train},
          {"val_positions", r.n_val},
          {"train_sequences", r.n_train_seq},
          {"val_sequences", r.n_val_seq},
          {"hidden", t.train.hidden},
          {"min_position", t.min_position},
          {"best_epoch", r.best_epoch},
          {"epochs_run", r.epochs_run},
          {"train_loss", r.train_loss},
          {"val_loss", r.val_loss},
          {"val_roc_auc", m.roc_auc},
          {"val_pr_auc", m.pr_auc},
          {"val_positive_rate", m.positive_rate},
          {"val_curve", std::move(curve)},
          {"seed", t.train.seed}};
}

}  // namespace

std::string train_router_file(const RouterTraining& t) {
  LabelSpec label;
  try {
    label = parse_label(t.label);
  } catch (const std::invalid_argument& e) {
    throw Error(e.what());
  }
  const TraceFile trace = read_traces(t.traces);
  const Dataset data = make_dataset(trace, label, t.min_position);
  if (label.kind == LabelKind::Outcome && data.n() == 0) {
    throw Error(
        "--label outcome: no position of the traces has a measured outcome (collect "
        "them with --outcome-share)");
  }
  std::fprintf(stderr, "[train] %zu positions from %zu sequences, %d features, label %s\n",
               data.n(), trace.sequences.size(), data.spec.n_features(), label.describe().c_str());
  const TrainResult r = train_router(data, label, t.train);
  // The cloud-aware reference: the same rows, split and seed (the split depends on the sequence
  // ids and the seed only), the `gain` label.
  std::vector<double> aware;
  if (t.cloud_aware_reference) {
    const LabelSpec gain = parse_label("gain");
    const Dataset with_cloud = make_dataset(trace, gain, t.min_position, true);
    std::fprintf(stderr, "[train] the cloud-aware reference: %d features, label gain\n",
                 with_cloud.width());
    aware = train_router(with_cloud, gain, t.train).val.gap_recovered;
  }
  json summary =
      summary_json(t, label, data, r, report_curves(r, label, aware, t.cloud_aware_reference));
  RouterFileInfo info;
  info.vocab_hash = fingerprint_hex(trace.header.vocab_fingerprint);
  info.n_vocab = trace.header.n_vocab;
  info.edge_name = trace.header.model_name;
  info.cloud_name = t.cloud_name;
  info.label = label.describe();
  info.training_json = summary.dump();
  save_router(t.out, r.model, info);
  std::fprintf(stderr, "[train] wrote %s\n", t.out.c_str());
  return info.training_json;
}

std::shared_ptr<const MlpRouterModel> load_router_model(const std::string& path) {
  return load_router(path).model;
}

}  // namespace tandem::router
