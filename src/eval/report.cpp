// The report of `tandem eval` (tandem/eval_report.h): run summaries, results.md and the plots.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "eval/stats.h"
#include "tandem/eval_loglik.h"
#include "tandem/eval_report.h"

namespace tandem::eval {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// A number of the results' text. JSON has no NaN: the summaries wrote one as null, read back
// as the NaN it was, so that the report prints "nan" where it did before it read text.
double number(const json& v) {
  return v.is_null() ? std::nan("") : v.get<double>();
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// A run's per-item correctness, in the task's item order.
std::vector<bool> correctness(const ReportTask& task, const RunRecords& by_run,
                              const std::string& run) {
  std::vector<bool> v;
  for (const std::string& id : task.item_ids) v.push_back(by_run.at(run).at(id).correct);
  return v;
}

// A run's row: totals over its items, accuracy with its interval, the paired comparisons with
// local and cloud where those ran.
json run_row(const ReportRun& spec, const ReportTask& task, const RunRecords& by_run) {
  const bool have_local = by_run.count("local") > 0, have_cloud = by_run.count("cloud") > 0;
  const auto& recs = by_run.at(spec.name);
  int64_t n = 0, k = 0, tokens = 0, cloud = 0, events = 0, fallbacks = 0, agree = 0;
  int64_t generated = 0, generated_cloud = 0;
  uint64_t up = 0, down = 0;
  double ms = 0, wait_ms = 0;
  int64_t confirmed = 0, changed = 0, wasted = 0;
  for (const std::string& id : task.item_ids) {
    const ItemRecord& r = recs.at(id);
    ++n;
    k += r.correct;
    tokens += r.tokens;
    cloud += r.cloud_tokens;
    generated += r.generated;
    generated_cloud += r.generated_cloud;
    events += r.route_events;
    fallbacks += r.fallbacks;
    up += r.bytes_up;
    down += r.bytes_down;
    ms += r.ms;
    wait_ms += r.wait_ms;
    confirmed += r.route_confirmed;
    changed += r.route_changed;
    wasted += r.wasted_tokens;
    if (have_cloud) agree += r.answer == by_run.at("cloud").at(id).answer;
  }
  const double acc = n ? static_cast<double>(k) / n : 0;
  const Interval ci = wilson_interval(k, n);
  json row = {{"run", spec.name},
              {"mode", spec.mode},
              {"target_rate", spec.target_rate ? json(*spec.target_rate) : json(nullptr)},
              {"items", n},
              {"correct", k},
              {"accuracy", acc},
              {"ci95", {ci.low, ci.high}},
              {"cloud_share", tokens ? static_cast<double>(cloud) / tokens : 0.0},
              {"answer_tokens", tokens},
              {"cloud_tokens", cloud},
              {"generated_tokens", generated},
              {"generated_cloud_tokens", generated_cloud},
              {"generated_per_answer", n ? static_cast<double>(generated) / n : 0.0},
              {"cloud_share_of_generated",
               generated ? static_cast<double>(generated_cloud) / generated : 0.0},
              {"route_events", events},
              {"fallbacks", fallbacks},
              {"bytes_up", up},
              {"bytes_down", down},
              {"ms_per_answer", n ? ms / n : 0.0},
              {"tok_s", ms > 0 ? 1000.0 * generated / ms : 0.0},
              {"wait_ms_per_answer", n ? wait_ms / n : 0.0},
              {"route_confirmed", confirmed},
              {"route_changed", changed},
              {"wasted_tokens", wasted}};
  if (have_cloud) row["agreement_with_cloud"] = n ? static_cast<double>(agree) / n : 0.0;
  const auto mine = correctness(task, by_run, spec.name);
  if (have_local && spec.name != "local") {
    const Paired p = compare_paired(mine, correctness(task, by_run, "local"));
    row["vs_local"] = {{"better", p.only_a}, {"worse", p.only_b}, {"mcnemar_p", p.p}};
  }
  if (have_cloud && spec.name != "cloud") {
    const Paired p = compare_paired(mine, correctness(task, by_run, "cloud"));
    row["vs_cloud"] = {{"better", p.only_a}, {"worse", p.only_b}, {"mcnemar_p", p.p}};
  }
  return row;
}

// The oracle beside every row (docs/eval.md). A route turns an answer from wrong to right only
// by taking at least one cloud token in it, and one is enough for a letter, so the oracle
// charges one cloud token an answer and may fix any answer the device gets wrong and either the
// cloud or the row itself gets right. With the row's own cloud tokens as its budget it is an
// upper bound of the row: row = local + fixed - broken, and fixed <= min(fixable, cloud tokens).
// The curve for the plot: the answers the cloud alone fixes, at a share of the local run's
// answer tokens.
int64_t fixable_answers(const ReportTask& task, const RunRecords& by_run, const std::string& row) {
  const auto& local = by_run.at("local");
  const auto& cloud = by_run.at("cloud");
  const auto* mine = row.empty() ? nullptr : &by_run.at(row);
  int64_t fixable = 0;
  for (const std::string& id : task.item_ids) {
    const bool right_elsewhere = cloud.at(id).correct || (mine && mine->at(id).correct);
    fixable += !local.at(id).correct && right_elsewhere;
  }
  return fixable;
}

void add_oracle(const ReportTask& task, const RunRecords& by_run, double acc_local,
                double acc_cloud, json& table, json& results) {
  const double n = static_cast<double>(task.item_ids.size());
  const double gap = acc_cloud - acc_local;
  auto oracle_accuracy = [&](int64_t fixable, double budget_tokens) {
    return acc_local + static_cast<double>(oracle_fixes(fixable, budget_tokens)) / n;
  };
  for (auto& row : table) {
    if (row["mode"] == "local" || row["mode"] == "cloud") continue;
    const int64_t fixable = fixable_answers(task, by_run, row["run"].get<std::string>());
    const double oracle = oracle_accuracy(fixable, row["generated_cloud_tokens"].get<double>());
    row["oracle_accuracy"] = oracle;
    row["oracle_fixable"] = fixable;
    if (std::abs(gap) > 1e-12) {
      row["oracle_gap_recovered"] = (oracle - acc_local) / gap;
      if (oracle > acc_local + 1e-12) {
        row["share_of_oracle"] = (row["accuracy"].get<double>() - acc_local) / (oracle - acc_local);
      }
    }
  }
  int64_t local_tokens = 0;
  for (const std::string& id : task.item_ids) local_tokens += by_run.at("local").at(id).tokens;
  const int64_t cloud_fixes = fixable_answers(task, by_run, "");
  json curve = json::array();
  for (int pct = 0; pct <= 40; ++pct) {
    const double budget = pct / 100.0 * static_cast<double>(local_tokens);
    curve.push_back(
        {{"cloud_share", pct / 100.0}, {"accuracy", oracle_accuracy(cloud_fixes, budget)}});
  }
  results["oracle"] = {{"fixable_answers", cloud_fixes},
                       {"cost_per_answer", 1},
                       {"local_answer_tokens", local_tokens},
                       {"curve", curve}};
}

// The gap between local and cloud, each row's share of it and the oracle's (both runs present).
void add_gap(const ReportTask& task, const RunRecords& by_run, json& table, json& results) {
  double acc_local = 0, acc_cloud = 0;
  for (const auto& row : table) {
    if (row["run"] == "local") acc_local = row["accuracy"].get<double>();
    if (row["run"] == "cloud") acc_cloud = row["accuracy"].get<double>();
  }
  const Paired gap =
      compare_paired(correctness(task, by_run, "cloud"), correctness(task, by_run, "local"));
  results["gap"] = {{"local", acc_local},
                    {"cloud", acc_cloud},
                    {"mcnemar_p", gap.p},
                    {"significant", gap.p < 0.05}};
  for (auto& row : table) {
    if (std::abs(acc_cloud - acc_local) > 1e-12) {
      const GapRecovered g =
          gap_recovered(correctness(task, by_run, row["run"].get<std::string>()),
                        correctness(task, by_run, "local"), correctness(task, by_run, "cloud"));
      row["gap_recovered"] = g.value;
      row["gap_recovered_ci95"] = {g.ci95.low, g.ci95.high};
    }
  }
  add_oracle(task, by_run, acc_local, acc_cloud, table, results);
}

// A paired comparison's cell, "+BETTER/−WORSE (P)", or "–" where the row has none.
std::string paired_cell(const json& row, const char* key) {
  if (!row.contains(key)) return "–";
  const json& p = row[key];
  std::string cell = "+";
  cell += std::to_string(p["better"].get<int64_t>());
  cell += "/−" + std::to_string(p["worse"].get<int64_t>());
  cell += " (" + fmt("%.3g", number(p["mcnemar_p"])) + ")";
  return cell;
}

}  // namespace

std::string summarize_runs(const std::vector<ReportRun>& runs, const ReportTask& task,
                           const RunRecords& by_run) {
  json summaries = json::object();
  json table = json::array();
  for (const ReportRun& spec : runs) table.push_back(run_row(spec, task, by_run));
  if (by_run.count("local") > 0 && by_run.count("cloud") > 0)
    add_gap(task, by_run, table, summaries);
  summaries["runs"] = table;
  return summaries.dump();
}

void write_results_markdown(const std::string& out_dir, const ReportTask& task,
                            const std::string& results_json) {
  const json results = json::parse(results_json);
  std::ofstream md(fs::path(out_dir) / "results.md");
  md << "# " << task.name << ": " << task.item_ids.size() << " items, " << task.shots
     << " shots\n\n";
  md << "Command: `" << results["command"].get<std::string>() << "`  \n";
  md << "Edge: " << results["edge"]["name"].get<std::string>()
     << "; cloud: " << results["cloud"].value("model", std::string("-"))
     << "; machine: " << results["machine"].get<std::string>() << "\n\n";
  md << "| run | accuracy | 95% CI | cloud share | round trips per answer | gap recovered "
        "(95% CI) | oracle at that share | share of oracle | agreement with cloud | vs local "
        "(McNemar p) | KiB up / down per answer | ms per answer |\n";
  md << "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  auto pct = [](const json& r, const char* key, const char* f) {
    return r.contains(key) ? fmt(f, 100 * number(r[key])) : std::string("–");
  };
  for (const auto& r : results["runs"]) {
    const double n = std::max(1.0, number(r["items"]));
    std::string recovered = pct(r, "gap_recovered", "%.0f%%");
    if (r.contains("gap_recovered_ci95")) {
      recovered += " (" + fmt("%.0f", 100 * number(r["gap_recovered_ci95"][0])) + "–" +
                   fmt("%.0f%%", 100 * number(r["gap_recovered_ci95"][1])) + ")";
    }
    std::string oracle = "–";
    if (r.contains("oracle_accuracy")) {
      oracle = fmt("%.1f%%", 100 * number(r["oracle_accuracy"])) + " (" +
               pct(r, "oracle_gap_recovered", "%.0f%%") + " of the gap)";
    }
    md << "| " << r["run"].get<std::string>() << " | " << pct(r, "accuracy", "%.1f%%") << " | "
       << fmt("%.1f", 100 * number(r["ci95"][0])) << "–" << fmt("%.1f", 100 * number(r["ci95"][1]))
       << " | " << pct(r, "cloud_share", "%.1f%%") << " | "
       << fmt("%.2f", number(r["route_events"]) / n) << " | " << recovered << " | " << oracle
       << " | " << pct(r, "share_of_oracle", "%.0f%%") << " | "
       << pct(r, "agreement_with_cloud", "%.1f%%") << " | " << paired_cell(r, "vs_local") << " | "
       << fmt("%.1f", number(r["bytes_up"]) / 1024 / n) << " / "
       << fmt("%.1f", number(r["bytes_down"]) / 1024 / n) << " | "
       << fmt("%.0f", number(r["ms_per_answer"])) << " |\n";
  }
  if (task.word_rule) {
    md << "\nCloud share counts the answer word's tokens only (the word rule, docs/eval.md); "
          "round trips and bytes count everything sent.\n";
  }
  if (task.completion_rule) {
    md << "\nAccuracy is pass@1 (greedy; each completion run with its tests in the sandbox); "
          "cloud share counts the completion's tokens up to its stop sequence.\n";
  }
  if (results.contains("gap")) {
    md << "\nLocal " << fmt("%.1f%%", 100 * number(results["gap"]["local"])) << " vs cloud "
       << fmt("%.1f%%", 100 * number(results["gap"]["cloud"]))
       << ": McNemar p = " << fmt("%.3g", number(results["gap"]["mcnemar_p"]))
       << (results["gap"]["significant"].get<bool>()
               ? ".\n"
               : " — the pair's accuracy gap is within noise on this task; a 'gap recovered' "
                 "figure means nothing here.\n");
  }
}

void plot_results(const std::string& out_dir, const std::string& results_json) {
  const json results = json::parse(results_json);
  const fs::path dir = out_dir;
  {
    std::ofstream dat(dir / "pareto.dat");
    for (const auto& r : results["runs"]) {
      dat << '"' << r["run"].get<std::string>() << "\" " << 100 * number(r["cloud_share"]) << " "
          << 100 * number(r["accuracy"]) << " " << 100 * number(r["ci95"][0]) << " "
          << 100 * number(r["ci95"][1]) << " " << number(r["ms_per_answer"]) << "\n";
    }
  }
  if (results.contains("oracle")) {
    std::ofstream dat(dir / "oracle.dat");
    for (const auto& p : results["oracle"]["curve"]) {
      dat << 100 * number(p["cloud_share"]) << " " << 100 * number(p["accuracy"]) << "\n";
    }
  }
  std::ofstream gp(dir / "plots.gp");
  gp << "set terminal pngcairo size 900,600 font 'sans,11'\n"
        "set datafile separator ' '\n"
        "set output '"
     << (dir / "pareto.png").string()
     << "'\n"
        "set title 'Accuracy against cloud share ("
     << results["task"]["name"].get<std::string>()
     << ")'\n"
        "set xlabel 'cloud share of tokens (%)'\nset ylabel 'accuracy (%), 95% CI'\nset grid\n"
        "set key top left\nset xrange [-5:105]\nset yrange [0:*]\n"
        "plot '"
     << (dir / "pareto.dat").string()
     << "' using 2:3:4:5 with yerrorbars pt 7 ps 1.2 lc rgb '#1f77b4' notitle, "
        "'' using 2:3:1 with labels offset 1,1 left font ',9' notitle"
     << (results.contains("oracle")
             ? ", '" + (dir / "oracle.dat").string() +
                   "' using 1:2 with lines dt 2 lc rgb '#2ca02c' title 'oracle'"
             : std::string())
     << "\n"
        "set output '"
     << (dir / "latency.png").string()
     << "'\n"
        "set title 'Time per answer'\nset ylabel 'ms per answer'\nset xlabel ''\n"
        "set style fill solid 0.6\nset boxwidth 0.6\nset xrange [*:*]\nset yrange [0:*]\n"
        "set xtics rotate by -30\n"
        "plot '"
     << (dir / "pareto.dat").string() << "' using 0:6:xtic(1) with boxes lc rgb '#ff7f0e'\n";
  gp.close();
  std::string out;
  if (!run_gnuplot((dir / "plots.gp").string(), out))
    std::fprintf(stderr, "warning: gnuplot failed (is gnuplot-nox installed?): %s\n", out.c_str());
}

bool run_gnuplot(const std::string& script, std::string& output) {
  const std::string cmd = "gnuplot '" + script + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  output.clear();
  if (p) {
    char buf[256];
    while (fgets(buf, sizeof buf, p)) output += buf;
  }
  return (p ? pclose(p) : -1) == 0;
}

void write_loglik_report(const std::string& out_dir, const std::string& results_json,
                         const std::vector<std::string>& policies, bool plots) {
  const json results = json::parse(results_json);
  const json& rows = results["routes"];
  const json& curve = results["oracle_curve"];
  const double nll_edge = number(results["edge"]["nll"]);
  const double nll_cloud = number(results["cloud"]["nll"]);
  std::ofstream md(fs::path(out_dir) / "results.md");
  md << "# WikiText-2: teacher-forced log-likelihood under routing\n\nCommand: `"
     << results["command"].get<std::string>() << "`\n\n"
     << results["chunks"].get<int>() << " chunks of " << results["chunk_tokens"].get<int>()
     << " tokens, " << results["scored_positions"].get<size_t>() << " scored positions. Edge NLL "
     << fmt("%.4f", nll_edge) << " (PPL " << fmt("%.2f", std::exp(nll_edge)) << "), cloud NLL "
     << fmt("%.4f", nll_cloud) << " (PPL " << fmt("%.2f", std::exp(nll_cloud)) << "): a gap of "
     << fmt("%.3f", nll_edge - nll_cloud) << " nats per token.\n\n"
     << "| policy | target share | realised share | windows of " << kShareWindow
     << " within ±1 point (largest miss) | NLL | gap recovered | with a hindsight "
        "threshold | oracle at the same share | of the oracle "
        "|\n|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : rows) {
    md << "| " << r["policy"].get<std::string>() << " | "
       << fmt("%.0f%%", 100 * number(r["target"])) << " | "
       << fmt("%.1f%%", 100 * number(r["share"])) << " | "
       << fmt("%.1f%%", 100 * number(r["windows_within_1pt"]))
       << fmt(" (%.1f)", 100 * number(r["max_window_deviation"])) << " | "
       << fmt("%.4f", number(r["nll"])) << " | " << fmt("%.1f%%", 100 * number(r["gap_recovered"]))
       << " | " << fmt("%.1f%%", 100 * number(r["hindsight_threshold_gap_recovered"])) << " | "
       << fmt("%.1f%%", 100 * number(r["oracle_gap_recovered"])) << " | "
       << fmt("%.0f%%", 100 * number(r["of_oracle"])) << " |\n";
  }
  // Gap recovered against share: one line per policy, the oracle above them.
  {
    std::ofstream dat(fs::path(out_dir) / "loglik.dat");
    for (const auto& c : curve)
      dat << "oracle " << 100 * number(c["share"]) << " " << 100 * number(c["gap_recovered"])
          << "\n";
    for (const auto& p : policies) {
      dat << "\n\n";
      for (const auto& r : rows) {
        if (r["policy"] == p)
          dat << p << " " << 100 * number(r["share"]) << " " << 100 * number(r["gap_recovered"])
              << "\n";
      }
    }
    std::ofstream gp(fs::path(out_dir) / "loglik.gp");
    const std::string dat_path = (fs::path(out_dir) / "loglik.dat").string();
    gp << "set terminal pngcairo size 900,600 font 'sans,11'\nset output '"
       << (fs::path(out_dir) / "loglik.png").string()
       << "'\nset title 'WikiText-2: edge-to-cloud NLL gap recovered against cloud share'\n"
          "set xlabel 'cloud share of tokens (%)'\nset ylabel 'gap recovered (%)'\nset grid\n"
          "set key top left\nset yrange [0:*]\n"
          "plot '"
       << dat_path
       << "' index 0 using 2:3 with linespoints title 'oracle' lw 2, "
          "'' index 1 using 2:3 with linespoints title 'confidence', "
          "'' index 2 using 2:3 with linespoints title 'entropy', "
          "'' index 3 using 2:3 with linespoints title 'margin'";
    // The trained routers after the three heuristics, one line each.
    for (size_t k = 3; k < policies.size(); ++k)
      gp << ", '' index " << k + 1 << " using 2:3 with linespoints title '" << policies[k]
         << "' lw 2";
    gp << "\n";
  }
  if (plots) {
    // gnuplot's own words go to stdout, as they always have.
    std::string said;
    const bool drawn = run_gnuplot((fs::path(out_dir) / "loglik.gp").string(), said);
    std::fputs(said.c_str(), stdout);
    if (!drawn) std::fprintf(stderr, "warning: gnuplot failed\n");
  }
}

}  // namespace tandem::eval
