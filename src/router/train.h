// Training a router MLP from traces: labels, a split by sequence, Adam, early stopping, metrics
// and a calibration table. Written here because Debian bookworm's mlpack/ensmallen are not
// installable from this project's mirror (docs/router.md); the optimiser is ~40 lines.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "router/trace.h"
#include "tandem/router_mlp.h"
#include "tandem/router_train.h"  // TrainOptions

namespace tandem::router {

// What the router learns to predict.
//   disagree       classify: edge top-1 != cloud top-1
//   fixes          classify: the edge's top-1 is not the true token and the cloud's is — on
//                  traces of a task's reference answers (`collect --task`), the positions where
//                  the cloud's token turns a wrong answer right (the outcome label for answers
//                  of one token)
//   critical:TAU   classify: the cloud's log-probability of the edge token < TAU (default -2)
//   gain           regress the cloud's gain on the true token, log p_cloud − log p_edge (the
//                  oracle's criterion: ranking by its expectation maximises the gap recovered)
//   gain:Q         classify: the top Q fraction of positions by that gain
//   kl             regress KL(cloud || edge) of the two next-token distributions: the gain's
//                  expectation were the cloud the truth, a far less noisy target than one
//                  sampled token's gain
//   kl:log         regress log(KL + 0.01): the same ranking target with its long tail folded
//   outcome:TAU    classify: routing the position moves the edge's greedy continuation towards
//                  the cloud-only continuation by at least TAU (default 0.25; the record's
//                  outcome, `collect --outcome-share`); only records with a measured outcome
enum class LabelKind { Disagree, Fixes, Critical, Gain, GainTop, Kl, LogKl, Outcome };
struct LabelSpec {
  LabelKind kind = LabelKind::Gain;
  double tau = -2.0;  // the threshold of critical (default -2) and outcome (default 0.25)
  double q = 0.1;     // gain:Q
  bool regression() const {
    return kind == LabelKind::Gain || kind == LabelKind::Kl || kind == LabelKind::LogKl;
  }
  std::string describe() const;
};
// Throws std::invalid_argument naming the spec and the choices.
LabelSpec parse_label(const std::string& spec);

// Positions as rows: raw features, target, and what the metrics need.
struct Dataset {
  RouterFeatureSpec spec;
  // With cloud columns (make_dataset's `cloud_columns`), each row ends in three values only the
  // cloud knows — KL(cloud || edge), the cloud's log-probability of the edge's top-1, and whether
  // the two top-1s agree — for a reference model of what a router could reach if it saw both
  // distributions. Such a model is not a router: the device cannot compute its features.
  int n_cloud_columns = 0;
  std::vector<float> x;       // [n][width()]
  std::vector<float> y;       // target (0/1 or the gain)
  std::vector<float> gain;    // cloud_lp_true − edge_lp_true ([n]; 0 without a true token)
  std::vector<float> kl;      // KL(cloud || edge) per row
  std::vector<uint64_t> seq;  // sequence id per row
  size_t n() const { return y.size(); }
  int width() const { return spec.n_features() + n_cloud_columns; }
};

// Builds rows from the records at positions >= min_position that have a true token.
Dataset make_dataset(const TraceFile& trace, const LabelSpec& label, int min_position = 0,
                     bool cloud_columns = false);

struct Metrics {
  double roc_auc = 0, pr_auc = 0, positive_rate = 0;
  // Cloud share s → recall of positives within the top-s scores, and gap recovered (the sum of
  // the routed rows' gain over the sum of all gains) with the oracle's at the same share.
  std::vector<double> shares, recall, gap_recovered, oracle_gap_recovered;
  // The same when routing by the recorded KL(cloud || edge) (a ceiling for the kl label).
  std::vector<double> kl_gap_recovered;
};

struct TrainResult {
  MlpRouterModel model;
  size_t n_train = 0, n_val = 0, n_train_seq = 0, n_val_seq = 0;
  int best_epoch = 0, epochs_run = 0;
  double train_loss = 0, val_loss = 0;
  Metrics val;
  Metrics val_entropy;  // the entropy policy on the same validation rows, for comparison
  std::vector<float> val_scores;
};

TrainResult train_router(const Dataset& data, const LabelSpec& label, const TrainOptions& o);

// Binary reference labels for metrics: the label itself, or for `gain` the top 10% by gain.
std::vector<uint8_t> binary_labels(const std::vector<float>& y, const std::vector<float>& gain,
                                   const LabelSpec& label);
Metrics evaluate_scores(const std::vector<float>& scores, const std::vector<uint8_t>& positive,
                        const std::vector<float>& gain, const std::vector<float>& kl = {});
double roc_auc(const std::vector<float>& scores, const std::vector<uint8_t>& positive);
double pr_auc(const std::vector<float>& scores, const std::vector<uint8_t>& positive);
// Calibration table from scores: n thresholds at evenly spaced quantiles, ascending, with the
// share of scores strictly above each.
void calibrate(MlpRouterModel& model, std::vector<float> scores, int n = 129);

}  // namespace tandem::router
