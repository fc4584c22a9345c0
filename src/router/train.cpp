// Router training (see train.h).
#include "router/train.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <stdexcept>

#include "common/error.h"
#include "common/splitmix.h"

namespace tandem::router {
namespace {

// A seeded stream (common/splitmix.h) that gives the same numbers on every platform.
struct Rng {
  uint64_t state;
  uint64_t next() { return splitmix64(state); }
  double uniform() { return unit_interval(next()); }
  double normal() {
    const double u1 = std::max(uniform(), 1e-300), u2 = uniform();
    return std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
};

// Adam state for one parameter array.
struct AdamSlot {
  std::vector<float> m, v;
  void init(size_t n) { m.assign(n, 0), v.assign(n, 0); }
  void step(std::vector<float>& w, const std::vector<float>& g, double lr, double wd, int t,
            bool decay) {
    constexpr double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    const double c1 = 1 - std::pow(b1, t), c2 = 1 - std::pow(b2, t);
    for (size_t i = 0; i < w.size(); ++i) {
      m[i] = static_cast<float>(b1 * m[i] + (1 - b1) * g[i]);
      v[i] = static_cast<float>(b2 * v[i] + (1 - b2) * g[i] * g[i]);
      double upd = (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
      if (decay) upd += wd * w[i];  // decoupled weight decay (AdamW), not on biases
      w[i] -= static_cast<float>(lr * upd);
    }
  }
};

double sigmoid(double z) {
  return z >= 0 ? 1 / (1 + std::exp(-z)) : std::exp(z) / (1 + std::exp(z));
}

// Per-row loss and its derivative with respect to the output, with the row's weight.
double loss_and_grad(double out, double y, bool regression, double w_pos, double* dout) {
  if (regression) {
    const double d = out - y;
    *dout = d;
    return 0.5 * d * d;
  }
  const double w = y > 0.5 ? w_pos : 1.0;
  const double p = sigmoid(out);
  *dout = w * (p - y);
  // log(1 + e^-|z|) + max(z, 0) - z y: the stable binary cross-entropy with logits.
  return w * (std::log1p(std::exp(-std::abs(out))) + std::max(out, 0.0) - out * y);
}

// Forward over a batch of standardised rows; acts[l] holds layer l's input [b][n_in].
void forward(const std::vector<MlpLayer>& layers, std::vector<std::vector<float>>& acts, int b,
             std::vector<float>& out) {
  for (size_t l = 0; l < layers.size(); ++l) {
    const MlpLayer& L = layers[l];
    const bool last = l + 1 == layers.size();
    const std::vector<float>& a = acts[l];
    std::vector<float>& z = last ? out : acts[l + 1];
    z.assign(static_cast<size_t>(b) * L.n_out, 0);
    for (int r = 0; r < b; ++r) {
      const float* ar = a.data() + static_cast<size_t>(r) * L.n_in;
      for (int o = 0; o < L.n_out; ++o) {
        const float* w = L.weight.data() + static_cast<size_t>(o) * L.n_in;
        float acc = 0;
        for (int i = 0; i < L.n_in; ++i) acc += w[i] * ar[i];
        acc += L.bias[o];
        z[static_cast<size_t>(r) * L.n_out + o] = last ? acc : std::max(acc, 0.0f);
      }
    }
  }
}

void standardise_rows(const Dataset& d, const MlpRouterModel& m, const std::vector<size_t>& rows,
                      size_t from, int b, std::vector<float>& out) {
  const int F = d.width();
  out.resize(static_cast<size_t>(b) * F);
  for (int r = 0; r < b; ++r) {
    const float* x = d.x.data() + rows[from + r] * F;
    float* o = out.data() + static_cast<size_t>(r) * F;
    for (int i = 0; i < F; ++i) o[i] = (x[i] - m.mean[i]) / m.scale[i];
  }
}

std::vector<float> predict(const Dataset& d, const MlpRouterModel& m,
                           const std::vector<size_t>& rows) {
  std::vector<float> scores(rows.size());
  std::vector<std::vector<float>> acts(m.layers.size());
  std::vector<float> out;
  constexpr int kBatch = 256;
  for (size_t s = 0; s < rows.size(); s += kBatch) {
    const int b = static_cast<int>(std::min<size_t>(kBatch, rows.size() - s));
    standardise_rows(d, m, rows, s, b, acts[0]);
    forward(m.layers, acts, b, out);
    std::copy(out.begin(), out.end(), scores.begin() + s);
  }
  return scores;
}

}  // namespace

std::string LabelSpec::describe() const {
  char buf[64];
  switch (kind) {
    case LabelKind::Disagree:
      return "disagree";
    case LabelKind::Fixes:
      return "fixes";
    case LabelKind::Critical:
      std::snprintf(buf, sizeof buf, "critical:%g", tau);
      return buf;
    case LabelKind::Gain:
      return "gain";
    case LabelKind::GainTop:
      std::snprintf(buf, sizeof buf, "gain:%g", q);
      return buf;
    case LabelKind::Kl:
      return "kl";
    case LabelKind::LogKl:
      return "kl:log";
    case LabelKind::Outcome:
      std::snprintf(buf, sizeof buf, "outcome:%g", tau);
      return buf;
  }
  return "?";
}

LabelSpec parse_label(const std::string& spec) {
  LabelSpec l;
  const std::string name = spec.substr(0, spec.find(':'));
  const bool has_arg = spec.find(':') != std::string::npos;
  const std::string arg = has_arg ? spec.substr(name.size() + 1) : "";
  auto number = [&](const char* what) {
    try {
      size_t used = 0;
      const double v = std::stod(arg, &used);
      if (used != arg.size()) throw std::invalid_argument(arg);
      return v;
    } catch (const std::exception&) {
      throw std::invalid_argument("--label " + spec + ": " + what + " '" + arg +
                                  "' is not a number");
    }
  };
  if (name == "disagree" && !has_arg) {
    l.kind = LabelKind::Disagree;
  } else if (name == "fixes" && !has_arg) {
    l.kind = LabelKind::Fixes;
  } else if (name == "critical") {
    l.kind = LabelKind::Critical;
    if (has_arg) l.tau = number("TAU");
  } else if (name == "kl" && !has_arg) {
    l.kind = LabelKind::Kl;
  } else if (name == "kl" && arg == "log") {
    l.kind = LabelKind::LogKl;
  } else if (name == "outcome") {
    l.kind = LabelKind::Outcome;
    l.tau = has_arg ? number("TAU") : 0.25;
    if (!(l.tau > 0 && l.tau <= 1))
      throw std::invalid_argument("--label " + spec + ": TAU must be in (0, 1]");
  } else if (name == "gain" && !has_arg) {
    l.kind = LabelKind::Gain;
  } else if (name == "gain") {
    l.kind = LabelKind::GainTop;
    l.q = number("Q");
    if (!(l.q > 0 && l.q < 1))
      throw std::invalid_argument("--label " + spec + ": Q must be in (0, 1)");
  } else {
    throw std::invalid_argument(
        "unknown label '" + spec +
        "' (choices: disagree, fixes, critical[:TAU], gain, gain:Q, kl, kl:log, "
        "outcome[:TAU])");
  }
  return l;
}

Dataset make_dataset(const TraceFile& trace, const LabelSpec& label, int min_position,
                     bool cloud_columns) {
  Dataset d;
  d.spec.n_embd = static_cast<int>(trace.header.n_embd);
  d.spec.top_k = static_cast<int>(trace.header.top_k);
  d.n_cloud_columns = cloud_columns ? 3 : 0;
  const int F = d.width();
  for (const auto& s : trace.sequences) {
    for (const auto& r : s.records) {
      // Rows without a true token have no gain to score routing by; every label skips them.
      if (r.true_token < 0 || r.position < min_position) continue;
      // The outcome label learns from the sequences whose outcome was measured only.
      if (label.kind == LabelKind::Outcome && std::isnan(r.outcome)) continue;
      const size_t at = d.x.size();
      d.x.resize(at + F);
      // A record's row `position` decides the token after it, with position + 1 tokens of
      // history: the signal position a device passes (RouterSignal::position).
      router_features(d.spec, r.hidden, r.log_top, r.entropy, r.margin, r.position + 1, &d.x[at]);
      if (cloud_columns) {
        float* c = &d.x[at + d.spec.n_features()];
        c[0] = r.kl_cloud_edge;
        c[1] = r.cloud_lp_edge;
        c[2] = r.edge_top1 == r.cloud_top1 ? 1.0f : 0.0f;
      }
      const float g = r.true_token >= 0 ? r.cloud_lp_true - r.edge_lp_true : 0.0f;
      d.gain.push_back(g);
      d.kl.push_back(r.kl_cloud_edge);
      d.seq.push_back(s.id);
      switch (label.kind) {
        case LabelKind::Disagree:
          d.y.push_back(r.edge_top1 != r.cloud_top1 ? 1.0f : 0.0f);
          break;
        case LabelKind::Fixes:
          d.y.push_back(r.edge_top1 != r.true_token && r.cloud_top1 == r.true_token ? 1.0f : 0.0f);
          break;
        case LabelKind::Critical:
          d.y.push_back(r.cloud_lp_edge < label.tau ? 1.0f : 0.0f);
          break;
        case LabelKind::Gain:
        case LabelKind::GainTop:
          d.y.push_back(g);
          break;
        case LabelKind::Kl:
          d.y.push_back(r.kl_cloud_edge);
          break;
        case LabelKind::LogKl:
          d.y.push_back(std::log(std::max(r.kl_cloud_edge, 0.0f) + 0.01f));
          break;
        case LabelKind::Outcome:
          d.y.push_back(r.outcome >= label.tau ? 1.0f : 0.0f);
          break;
      }
    }
  }
  if (label.kind == LabelKind::GainTop && !d.y.empty()) {
    // The (1 − q) quantile of the gains over the whole trace marks the positives.
    std::vector<float> sorted = d.gain;
    const size_t k =
        std::min(sorted.size() - 1, static_cast<size_t>(std::floor((1 - label.q) * sorted.size())));
    std::nth_element(sorted.begin(), sorted.begin() + k, sorted.end());
    const float cut = sorted[k];
    for (size_t i = 0; i < d.y.size(); ++i) d.y[i] = d.gain[i] >= cut ? 1.0f : 0.0f;
  }
  return d;
}

std::vector<uint8_t> binary_labels(const std::vector<float>& y, const std::vector<float>& gain,
                                   const LabelSpec& label) {
  std::vector<uint8_t> pos(y.size());
  if (!label.regression()) {
    for (size_t i = 0; i < y.size(); ++i) pos[i] = y[i] > 0.5f;
    return pos;
  }
  if (gain.empty()) return pos;
  std::vector<float> sorted = gain;
  const size_t k = static_cast<size_t>(std::floor(0.9 * (sorted.size() - 1)));
  std::nth_element(sorted.begin(), sorted.begin() + k, sorted.end());
  for (size_t i = 0; i < gain.size(); ++i) pos[i] = gain[i] >= sorted[k];
  return pos;
}

double roc_auc(const std::vector<float>& scores, const std::vector<uint8_t>& positive) {
  // Mann–Whitney U with average ranks for ties.
  const size_t n = scores.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double rank_sum = 0;
  size_t n_pos = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && scores[order[j]] == scores[order[i]]) ++j;
    const double avg_rank = (i + j + 1) / 2.0;  // ranks are 1-based
    for (size_t k = i; k < j; ++k) {
      if (positive[order[k]]) rank_sum += avg_rank, ++n_pos;
    }
    i = j;
  }
  const size_t n_neg = n - n_pos;
  if (n_pos == 0 || n_neg == 0) return 0.5;
  return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (static_cast<double>(n_pos) * n_neg);
}

double pr_auc(const std::vector<float>& scores, const std::vector<uint8_t>& positive) {
  // Average precision: mean of the precision at each positive, scores descending.
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return scores[a] > scores[b]; });
  size_t tp = 0, n_pos = 0;
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    if (positive[order[i]]) {
      ++tp;
      sum += static_cast<double>(tp) / (i + 1);
    }
  }
  for (uint8_t p : positive) n_pos += p;
  return n_pos ? sum / n_pos : 0;
}

Metrics evaluate_scores(const std::vector<float>& scores, const std::vector<uint8_t>& positive,
                        const std::vector<float>& gain, const std::vector<float>& kl) {
  Metrics m;
  m.roc_auc = roc_auc(scores, positive);
  m.pr_auc = pr_auc(scores, positive);
  size_t n_pos = 0;
  for (uint8_t p : positive) n_pos += p;
  m.positive_rate = scores.empty() ? 0 : static_cast<double>(n_pos) / scores.size();
  const size_t n = scores.size();
  std::vector<size_t> by_score(n), by_gain(n), by_kl(n);
  std::iota(by_score.begin(), by_score.end(), 0);
  std::iota(by_gain.begin(), by_gain.end(), 0);
  std::iota(by_kl.begin(), by_kl.end(), 0);
  if (kl.size() == n) {
    std::stable_sort(by_kl.begin(), by_kl.end(), [&](size_t a, size_t b) { return kl[a] > kl[b]; });
  }
  std::stable_sort(by_score.begin(), by_score.end(),
                   [&](size_t a, size_t b) { return scores[a] > scores[b]; });
  std::stable_sort(by_gain.begin(), by_gain.end(),
                   [&](size_t a, size_t b) { return gain[a] > gain[b]; });
  double total_gain = 0;
  for (float g : gain) total_gain += g;
  for (double s : {0.01, 0.02, 0.05, 0.07, 0.1, 0.2, 0.3, 0.5}) {
    const size_t k = static_cast<size_t>(std::llround(s * n));
    size_t hits = 0;
    double g_score = 0, g_oracle = 0, g_kl = 0;
    for (size_t i = 0; i < k; ++i) {
      hits += positive[by_score[i]];
      g_score += gain[by_score[i]];
      g_oracle += gain[by_gain[i]];
      g_kl += gain[by_kl[i]];
    }
    if (kl.size() == n)
      m.kl_gap_recovered.push_back(std::abs(total_gain) > 1e-12 ? g_kl / total_gain : 0);
    m.shares.push_back(s);
    m.recall.push_back(n_pos ? static_cast<double>(hits) / n_pos : 0);
    m.gap_recovered.push_back(std::abs(total_gain) > 1e-12 ? g_score / total_gain : 0);
    m.oracle_gap_recovered.push_back(std::abs(total_gain) > 1e-12 ? g_oracle / total_gain : 0);
  }
  return m;
}

void calibrate(MlpRouterModel& model, std::vector<float> scores, int n) {
  model.calib_threshold.clear();
  model.calib_share.clear();
  if (scores.empty() || n < 2) return;
  std::sort(scores.begin(), scores.end());
  for (int i = 0; i < n; ++i) {
    const size_t idx = static_cast<size_t>(
        std::llround(static_cast<double>(i) / (n - 1) * static_cast<double>(scores.size() - 1)));
    const float t = scores[idx];
    const size_t above =
        scores.end() - std::upper_bound(scores.begin(), scores.end(), t);  // strictly above t
    model.calib_threshold.push_back(t);
    model.calib_share.push_back(static_cast<float>(above) / scores.size());
  }
}

namespace {

// Train and validation rows, split by sequence so that no sequence has rows on both sides.
struct RowSplit {
  std::vector<size_t> train_rows, val_rows;
  size_t n_seq = 0, n_val_seq = 0;  // distinct sequences, and how many of them validate
};

// Shuffles the distinct sequence ids; the first val_fraction of them validate (at least one
// and not all, when there are two or more). With one sequence only, falls back to a split by
// row (every fifth row validates), which the summary's counts show.
RowSplit split_by_sequence(const Dataset& d, double val_fraction, Rng& rng) {
  RowSplit split;
  std::vector<uint64_t> ids = d.seq;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[rng.below(i)]);
  size_t n_val_seq = static_cast<size_t>(std::llround(val_fraction * ids.size()));
  if (ids.size() >= 2) n_val_seq = std::clamp<size_t>(n_val_seq, 1, ids.size() - 1);
  std::vector<uint64_t> val_ids(ids.begin(), ids.begin() + n_val_seq);
  std::sort(val_ids.begin(), val_ids.end());
  std::vector<size_t>& train_rows = split.train_rows;
  std::vector<size_t>& val_rows = split.val_rows;
  for (size_t i = 0; i < d.n(); ++i) {
    (std::binary_search(val_ids.begin(), val_ids.end(), d.seq[i]) ? val_rows : train_rows)
        .push_back(i);
  }
  if (val_rows.empty() || train_rows.empty()) {
    train_rows.clear(), val_rows.clear();
    for (size_t i = 0; i < d.n(); ++i) (i % 5 == 4 ? val_rows : train_rows).push_back(i);
  }
  split.n_seq = ids.size();
  split.n_val_seq = n_val_seq;
  return split;
}

// m.mean and m.scale [F]: the mean and standard deviation of each feature over `rows` (a
// constant feature gets scale 1).
void fit_standardisation(const Dataset& d, const std::vector<size_t>& rows, MlpRouterModel& m) {
  const int F = d.width();
  m.mean.assign(F, 0);
  m.scale.assign(F, 0);
  std::vector<double> sum(F, 0), sq(F, 0);
  for (size_t r : rows) {
    const float* x = d.x.data() + r * F;
    for (int i = 0; i < F; ++i) sum[i] += x[i], sq[i] += static_cast<double>(x[i]) * x[i];
  }
  const double nt = static_cast<double>(rows.size());
  for (int i = 0; i < F; ++i) {
    const double mu = sum[i] / nt, var = std::max(0.0, sq[i] / nt - mu * mu);
    m.mean[i] = static_cast<float>(mu);
    m.scale[i] = var > 1e-12 ? static_cast<float>(std::sqrt(var)) : 1.0f;
  }
}

// He-initialised layers F → hidden... → 1; weights [n_out][n_in], biases zero.
void init_layers(MlpRouterModel& m, int F, const std::vector<int>& hidden, Rng& rng) {
  std::vector<int> widths = {F};
  widths.insert(widths.end(), hidden.begin(), hidden.end());
  widths.push_back(1);
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    MlpLayer L;
    L.n_in = widths[l];
    L.n_out = widths[l + 1];
    L.weight.resize(static_cast<size_t>(L.n_in) * L.n_out);
    const double sd = std::sqrt(2.0 / L.n_in);
    for (float& w : L.weight) w = static_cast<float>(sd * rng.normal());
    L.bias.assign(L.n_out, 0);
    m.layers.push_back(std::move(L));
  }
}

// The weight of a positive row in the loss: negatives / positives over the training rows, so
// both classes weigh the same (1 for regression, without class weighting, or one class only).
double positive_weight(const Dataset& d, const LabelSpec& label, const TrainOptions& o,
                       const std::vector<size_t>& train_rows) {
  double w_pos = 1;
  if (!label.regression() && o.class_weighting) {
    size_t n_pos = 0;
    for (size_t r : train_rows) n_pos += d.y[r] > 0.5f;
    if (n_pos > 0 && n_pos < train_rows.size())
      w_pos = static_cast<double>(train_rows.size() - n_pos) / n_pos;
  }
  return w_pos;
}

// What the loss needs besides the model: the data, the label kind and the class weight.
struct LossContext {
  const Dataset& d;
  bool regression;
  double w_pos;
};

// Mean loss of the model over `rows`; their scores into *scores_out when given.
double mean_loss(const LossContext& ctx, const MlpRouterModel& m, const std::vector<size_t>& rows,
                 std::vector<float>* scores_out) {
  const std::vector<float> s = predict(ctx.d, m, rows);
  double total = 0, unused;
  for (size_t i = 0; i < rows.size(); ++i)
    total += loss_and_grad(s[i], ctx.d.y[rows[i]], ctx.regression, ctx.w_pos, &unused);
  if (scores_out) *scores_out = s;
  return total / static_cast<double>(rows.size());
}

// The buffers of one mini-batch step, kept across batches (b rows): acts[l] is layer l's input
// [b][n_in]; deltas[l] is d loss / d (pre-activation output of layer l) [b][n_out], the mean
// over the batch; grad_w/grad_b are shaped like the layer; t counts Adam steps.
struct Backprop {
  std::vector<AdamSlot> adam_w, adam_b;
  std::vector<std::vector<float>> grad_w, grad_b;
  std::vector<std::vector<float>> acts, deltas;
  std::vector<float> out;
  int t = 0;

  explicit Backprop(const MlpRouterModel& m)
      : adam_w(m.layers.size()),
        adam_b(m.layers.size()),
        grad_w(m.layers.size()),
        grad_b(m.layers.size()),
        acts(m.layers.size()),
        deltas(m.layers.size() + 1) {
    for (size_t l = 0; l < m.layers.size(); ++l) {
      adam_w[l].init(m.layers[l].weight.size());
      adam_b[l].init(m.layers[l].bias.size());
    }
  }
};

// From deltas of the last layer down: each layer's gradients, then the deltas of the layer
// below through its weights and ReLU (whose output is acts[l]).
void backward(const std::vector<MlpLayer>& layers, Backprop& bp, int b) {
  for (size_t l = layers.size(); l-- > 0;) {
    const MlpLayer& L = layers[l];
    const std::vector<float>& a = bp.acts[l];
    const std::vector<float>& dz = bp.deltas[l];
    bp.grad_w[l].assign(L.weight.size(), 0);
    bp.grad_b[l].assign(L.n_out, 0);
    for (int r = 0; r < b; ++r) {
      const float* ar = a.data() + static_cast<size_t>(r) * L.n_in;
      for (int oo = 0; oo < L.n_out; ++oo) {
        const float g = dz[static_cast<size_t>(r) * L.n_out + oo];
        if (g == 0) continue;
        float* gw = bp.grad_w[l].data() + static_cast<size_t>(oo) * L.n_in;
        for (int i = 0; i < L.n_in; ++i) gw[i] += g * ar[i];
        bp.grad_b[l][oo] += g;
      }
    }
    if (l == 0) break;
    std::vector<float>& dprev = bp.deltas[l - 1];
    dprev.assign(static_cast<size_t>(b) * L.n_in, 0);
    for (int r = 0; r < b; ++r) {
      float* dp = dprev.data() + static_cast<size_t>(r) * L.n_in;
      for (int oo = 0; oo < L.n_out; ++oo) {
        const float g = dz[static_cast<size_t>(r) * L.n_out + oo];
        if (g == 0) continue;
        const float* w = L.weight.data() + static_cast<size_t>(oo) * L.n_in;
        for (int i = 0; i < L.n_in; ++i) dp[i] += g * w[i];
      }
      const float* ar = a.data() + static_cast<size_t>(r) * L.n_in;
      for (int i = 0; i < L.n_in; ++i)
        if (ar[i] <= 0) dp[i] = 0;
    }
  }
}

// One Adam step on the b rows order[s..s+b); adds their summed loss to *epoch_loss (row by row,
// the order the reported loss has always been summed in).
void train_batch(const LossContext& ctx, const TrainOptions& o, const std::vector<size_t>& order,
                 size_t s, int b, MlpRouterModel& m, Backprop& bp, double* epoch_loss) {
  const size_t n_layers = m.layers.size();
  standardise_rows(ctx.d, m, order, s, b, bp.acts[0]);
  forward(m.layers, bp.acts, b, bp.out);
  bp.deltas[n_layers - 1].resize(b);
  for (int r = 0; r < b; ++r) {
    double g;
    *epoch_loss += loss_and_grad(bp.out[r], ctx.d.y[order[s + r]], ctx.regression, ctx.w_pos, &g);
    bp.deltas[n_layers - 1][r] = static_cast<float>(g / b);
  }
  backward(m.layers, bp, b);
  ++bp.t;
  for (size_t l = 0; l < n_layers; ++l) {
    bp.adam_w[l].step(m.layers[l].weight, bp.grad_w[l], o.lr, o.weight_decay, bp.t, true);
    bp.adam_b[l].step(m.layers[l].bias, bp.grad_b[l], o.lr, o.weight_decay, bp.t, false);
  }
}

// Epochs of shuffled mini-batches with early stopping on the validation loss: res.model ends
// as the best epoch's model; res.epochs_run, best_epoch and train_loss are filled.
void run_epochs(const LossContext& ctx, const TrainOptions& o, const RowSplit& split, Rng& rng,
                TrainResult& res) {
  MlpRouterModel& m = res.model;
  Backprop bp(m);
  MlpRouterModel best = m;
  double best_val = INFINITY;
  int since_best = 0;
  std::vector<size_t> order = split.train_rows;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
    double epoch_loss = 0;
    for (size_t s = 0; s < order.size(); s += o.batch) {
      const int b = static_cast<int>(std::min<size_t>(o.batch, order.size() - s));
      train_batch(ctx, o, order, s, b, m, bp, &epoch_loss);
    }
    res.epochs_run = epoch;
    const double val_loss = mean_loss(ctx, m, split.val_rows, nullptr);
    if (o.verbose) {
      std::fprintf(stderr, "[train] epoch %3d  train loss %.5f  val loss %.5f%s\n", epoch,
                   epoch_loss / order.size(), val_loss, val_loss < best_val ? "  *" : "");
    }
    if (val_loss < best_val) {
      best_val = val_loss;
      best = m;
      res.best_epoch = epoch;
      res.train_loss = epoch_loss / order.size();
      since_best = 0;
    } else if (++since_best >= o.patience) {
      break;
    }
  }
  m = std::move(best);
}

// The final model's validation loss, scores and metrics, the entropy policy's metrics on the
// same rows (its score is one of the features), and the calibration table.
void validate(const LossContext& ctx, const LabelSpec& label, const std::vector<size_t>& val_rows,
              TrainResult& res) {
  const Dataset& d = ctx.d;
  res.val_loss = mean_loss(ctx, res.model, val_rows, &res.val_scores);
  std::vector<float> val_y, val_gain, val_kl;
  for (size_t r : val_rows) {
    val_y.push_back(d.y[r]);
    val_gain.push_back(d.gain[r]);
    if (d.kl.size() == d.n()) val_kl.push_back(d.kl[r]);
  }
  const std::vector<uint8_t> val_pos = binary_labels(val_y, val_gain, label);
  res.val = evaluate_scores(res.val_scores, val_pos, val_gain, val_kl);
  std::vector<float> val_entropy;
  const int F = d.width();
  for (size_t r : val_rows) val_entropy.push_back(d.x[r * F + d.spec.n_embd + d.spec.top_k]);
  res.val_entropy = evaluate_scores(val_entropy, val_pos, val_gain);
  calibrate(res.model, res.val_scores);
}

}  // namespace

TrainResult train_router(const Dataset& d, const LabelSpec& label, const TrainOptions& o) {
  const int F = d.width();
  if (d.n() < 10) throw Error("router training: " + std::to_string(d.n()) + " rows, need >= 10");
  if (o.hidden.empty() || o.hidden.size() > 2)
    throw Error("router training: 1 or 2 hidden layers, not " + std::to_string(o.hidden.size()));
  Rng rng{o.seed};  // drawn from in this order: the split, the initial weights, each epoch

  const RowSplit split = split_by_sequence(d, o.val_fraction, rng);
  TrainResult res;
  res.n_train = split.train_rows.size();
  res.n_val = split.val_rows.size();
  res.n_val_seq = split.n_val_seq;
  res.n_train_seq = split.n_seq - split.n_val_seq;
  res.model.spec = d.spec;

  fit_standardisation(d, split.train_rows, res.model);
  init_layers(res.model, F, o.hidden, rng);
  const LossContext ctx{d, label.regression(), positive_weight(d, label, o, split.train_rows)};
  run_epochs(ctx, o, split, rng, res);
  validate(ctx, label, split.val_rows, res);
  return res;
}

}  // namespace tandem::router
