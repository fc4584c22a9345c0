// Tokenization time of hostile texts (issue 21: a request's CPU must be bounded by its size).
// Each case is a text of --bytes bytes (default 1,000,000) built to hit one weak spot of
// encode(): special-token matching, the SPM merge queue, BPE merges of one long word, the
// pre-tokenizer regexes, invalid UTF-8. Every case runs in both parse_special modes.
//
//   ./bench_tokenize_hostile VOCAB.gguf [--bytes N] [--case NAME] [--reps R]
//
// Prints one row per case and mode: case, parse_special, bytes, tokens, median ms of R runs.
// A plain timing program rather than Google Benchmark: one run of a slow case can take minutes
// before the fix, and the driver below lets a shell loop put a timeout on each case.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/splitmix.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace tandem;

std::string repeat_to(std::string_view unit, size_t bytes) {
  std::string s;
  s.reserve(bytes + unit.size());
  while (s.size() + unit.size() <= bytes) s += unit;
  return s;
}

std::string random_printable(size_t bytes, uint64_t seed) {
  std::string s(bytes, ' ');
  for (char& c : s) c = static_cast<char>(' ' + splitmix64(seed) % 95);
  return s;
}

std::string random_bytes(size_t bytes, uint64_t seed) {
  std::string s(bytes, '\0');
  for (char& c : s) c = static_cast<char>(splitmix64(seed) & 0xFF);
  return s;
}

std::string random_word(size_t bytes, uint64_t seed) {
  std::string s(bytes, 'a');
  for (char& c : s) c = static_cast<char>('a' + splitmix64(seed) % 26);
  return s;
}

struct Case {
  const char* name;
  std::function<std::string(size_t)> make;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      // The body: random printable text (every byte pair occurs, so no special token
      // is ruled out cheaply) and then '<' on every byte.
      {"issue21",
       [](size_t n) {
         return random_printable(n * 6 / 100, 1) + std::string(n - n * 6 / 100, '<');
       }},
      {"all_lt", [](size_t n) { return std::string(n, '<'); }},
      {"long_word", [](size_t n) { return random_word(n, 2); }},
      {"random_bytes", [](size_t n) { return random_bytes(n, 3); }},
      {"emoji", [](size_t n) { return repeat_to("\xF0\x9F\x98\x80", n); }},
      {"prefixes",
       [](size_t n) {
         return repeat_to("<start_of_tur<end_of_tur<|im_star<|endoftex<unused1", n);
       }},
      {"newlines", [](size_t n) { return std::string(n, '\n'); }},
      {"spaces", [](size_t n) { return std::string(n, ' '); }},
      {"specials", [](size_t n) { return repeat_to("<start_of_turn><|im_start|>\n", n); }},
  };
  return all;
}

double time_ms(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s VOCAB.gguf [--bytes N] [--case NAME] [--reps R]\ncases:", argv[0]);
    for (const auto& c : cases()) std::fprintf(stderr, " %s", c.name);
    std::fprintf(stderr, "\n");
    return 2;
  }
  size_t bytes = 1000000;
  std::string only;
  int reps = 1;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--bytes")
      bytes = std::strtoull(argv[i + 1], nullptr, 10);
    else if (flag == "--case")
      only = argv[i + 1];
    else if (flag == "--reps")
      reps = std::max(1, std::atoi(argv[i + 1]));
  }
  auto file = GgufFile::open(argv[1]);
  auto tok = Tokenizer::from_gguf(*file);
  std::printf("| vocab | case | parse_special | bytes | tokens | ms (median of %d) |\n", reps);
  for (const auto& c : cases()) {
    if (!only.empty() && only != c.name) continue;
    const std::string text = c.make(bytes);
    for (bool parse_special : {false, true}) {
      std::vector<double> ms;
      size_t n_tokens = 0;
      for (int r = 0; r < reps; ++r)
        ms.push_back(time_ms([&] { n_tokens = tok->encode(text, true, parse_special).size(); }));
      std::sort(ms.begin(), ms.end());
      std::printf("| %s | %s | %d | %zu | %zu | %.1f |\n", std::string(tok->model_name()).c_str(),
                  c.name, parse_special, text.size(), n_tokens, ms[ms.size() / 2]);
      std::fflush(stdout);
    }
  }
  return 0;
}
