// The report of `tandem eval` over a task's runs (docs/eval.md): each run's summary with its
// statistics (accuracy and its 95% interval, paired McNemar tests against local and cloud, the
// gap recovered and the oracle at the run's own cloud share), results.md, and the plots drawn
// by gnuplot; and the report of eval --task wikitext. The summaries land in results.json as the
// CLI writes it. JSON crosses this header as text, so that its callers need no JSON library's
// types from it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tandem::eval {

// One item of one run, as its item log (items-RUN.jsonl) holds it.
struct ItemRecord {
  std::string id;
  bool correct = false;
  std::string answer;  // "" when none could be extracted
  // Answer tokens: a word task counts only the tokens that make up the answer word (the word
  // rule, docs/eval.md), other tasks every token generated. `generated` counts every token.
  int tokens = 0, cloud_tokens = 0, route_events = 0, fallbacks = 0;
  int generated = 0, generated_cloud = 0;
  uint64_t bytes_up = 0, bytes_down = 0;
  double ms = 0;
  // Time stood still for the network; route events the cloud confirmed or changed; tokens
  // decoded ahead of an answer and thrown away (EdgeStats).
  double wait_ms = 0;
  int route_confirmed = 0, route_changed = 0, wasted_tokens = 0;
};

// ItemRecord's counts, in the order an items-RUN.jsonl line holds them: visit(name, field) for
// each; the eval writes and reads its log through this one list.
template <class Visit, class Record>  // Record: ItemRecord or const ItemRecord
void visit_item_counts(Visit&& visit, Record& r) {
  visit("tokens", r.tokens);
  visit("cloud_tokens", r.cloud_tokens);
  visit("generated", r.generated);
  visit("generated_cloud", r.generated_cloud);
  visit("route_events", r.route_events);
  visit("fallbacks", r.fallbacks);
  visit("bytes_up", r.bytes_up);
  visit("bytes_down", r.bytes_down);
  visit("ms", r.ms);
  visit("wait_ms", r.wait_ms);
  visit("route_confirmed", r.route_confirmed);
  visit("route_changed", r.route_changed);
  visit("wasted_tokens", r.wasted_tokens);
}

// Per run name, per item id.
using RunRecords = std::map<std::string, std::map<std::string, ItemRecord>>;

// A run as the report names it: "local", "cloud", "route-confidence-5%", ...; its mode's name
// (edge_mode_name) and route mode's target share.
struct ReportRun {
  std::string name, mode;
  std::optional<double> target_rate;
};

// The task as the report needs it: its items in order (every run holds each of them).
struct ReportTask {
  std::string name;
  std::vector<std::string> item_ids;
  int shots = 0;
  bool word_rule = false;        // LAMBADA: cloud share counts the answer word's tokens only
  bool completion_rule = false;  // HumanEval: the completion's tokens, up to its stop sequence
};

// The runs' summaries for results.json, as the text of a JSON object: "runs" (a row per run),
// and with both a local and a cloud run "gap" and "oracle" (the oracle's curve for the plot).
// The caller merges its members into results.json's object.
std::string summarize_runs(const std::vector<ReportRun>& runs, const ReportTask& task,
                           const RunRecords& by_run);

// out_dir/results.md: the runs' table from `results_json`, the text of results.json (the
// summaries of summarize_runs merged in).
void write_results_markdown(const std::string& out_dir, const ReportTask& task,
                            const std::string& results_json);

// out_dir/pareto.png (accuracy against cloud share, 95% intervals, the oracle's curve) and
// latency.png (time per answer) through gnuplot, with their .dat files and plots.gp; a warning
// on stderr when gnuplot fails.
// `results_json`: the text of results.json, as for write_results_markdown.
void plot_results(const std::string& out_dir, const std::string& results_json);

// eval --task wikitext: out_dir/results.md, and loglik.dat, loglik.gp and (plots: through
// gnuplot) loglik.png, the gap recovered against cloud share with one line per policy (in
// `policies`' order) under the oracle's, from `results_json`, the text it wrote to results.json.
void write_loglik_report(const std::string& out_dir, const std::string& results_json,
                         const std::vector<std::string>& policies, bool plots);

// Runs `gnuplot 'SCRIPT'` (stderr with stdout); false when it fails. `output`: what it printed.
bool run_gnuplot(const std::string& script, std::string& output);

}  // namespace tandem::eval
