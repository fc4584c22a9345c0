#include "tandem/eval_tasks.h"

#include <cctype>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace tandem::eval {

using json = nlohmann::json;

namespace {

std::vector<json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read " + path);
  std::vector<json> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      throw Error(path + ":" + std::to_string(n) + ": not a JSON object");
    }
    out.push_back(std::move(j));
  }
  return out;
}

std::string str(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_string()) {
    throw Error(where + ": field '" + key + "' is missing or not a string");
  }
  return j[key].get<std::string>();
}

// "Question: ...\nA. ...\nB. ...\nAnswer:"
std::string mc_question(const std::string& stem, const std::vector<std::string>& labels,
                        const std::vector<std::string>& texts) {
  std::string q = "Question: " + stem + "\n";
  for (size_t i = 0; i < labels.size(); ++i) q += labels[i] + ". " + texts[i] + "\n";
  return q + "Answer:";
}

// ARC and CommonsenseQA records: {"id", "question": {"stem", "choices": [{"label","text"}]},
// "answerKey"}. ARC labels some items 1-4: they become A-D by position.
Item mc_item(const json& r, const std::string& where) {
  Item it;
  it.id = str(r, "id", where);
  if (!r.contains("question") || !r["question"].is_object()) {
    throw Error(where + ": field 'question' is missing or not an object");
  }
  const json& q = r["question"];
  const std::string stem = str(q, "stem", where + " question");
  if (!q.contains("choices") || !q["choices"].is_array() || q["choices"].size() < 2 ||
      q["choices"].size() > 8) {
    throw Error(where + ": 'question.choices' must be an array of 2 to 8 choices");
  }
  std::vector<std::string> texts;
  std::string gold_label = str(r, "answerKey", where);
  for (size_t i = 0; i < q["choices"].size(); ++i) {
    const json& c = q["choices"][i];
    const std::string label = str(c, "label", where + " choice " + std::to_string(i));
    const std::string letter(1, static_cast<char>('A' + i));
    if (label == gold_label) it.gold = letter;
    it.labels.push_back(letter);
    texts.push_back(str(c, "text", where + " choice " + std::to_string(i)));
  }
  if (it.gold.empty()) {
    throw Error(where + ": answerKey '" + gold_label + "' is not one of the choices' labels");
  }
  it.question = mc_question(stem, it.labels, texts);
  return it;
}

std::string shot_text(const Item& it, TaskKind kind, const std::string& worked_answer = "") {
  if (kind == TaskKind::Numeric) return it.question + " " + worked_answer + "\n\n";
  return it.question + " " + it.gold + "\n\n";
}

// One UTF-8 character at text[i]: its code point and length; length 0 when the text ends
// inside it (a generation that is still writing it). A byte that starts no valid sequence is
// read as one character U+FFFD.
struct Utf8Char {
  uint32_t cp = 0;
  size_t len = 0;
};
Utf8Char utf8_at(std::string_view text, size_t i) {
  const auto b = static_cast<unsigned char>(text[i]);
  const size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  if (len == 0) return {0xFFFD, 1};
  if (i + len > text.size()) return {0, 0};
  uint32_t cp = len == 1 ? b : b & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    const auto c = static_cast<unsigned char>(text[i + k]);
    if ((c >> 6) != 2) return {0xFFFD, 1};
    cp = (cp << 6) | (c & 0x3F);
  }
  return {cp, len};
}

bool is_space(uint32_t cp) {
  return cp == ' ' || (cp >= '\t' && cp <= '\r') || cp == 0xA0 || (cp >= 0x2000 && cp <= 0x200B) ||
         cp == 0x3000;
}
// Marks that may open a quoted word: " ' ( [ « and the curly quotes.
bool is_opening_mark(uint32_t cp) {
  return cp == '"' || cp == '\'' || cp == '(' || cp == '[' || cp == 0xAB || cp == 0x2018 ||
         cp == 0x201C;
}
bool is_apostrophe(uint32_t cp) {
  return cp == '\'' || cp == 0x2019;
}
bool is_word_char(uint32_t cp) {
  if (cp < 0x80) return std::isalnum(static_cast<int>(cp)) != 0;
  if (cp == 0xFFFD || (cp >= 0xA0 && cp <= 0xBF) || cp == 0xD7 || cp == 0xF7) return false;
  if ((cp >= 0x2000 && cp <= 0x206F) || (cp >= 0x3000 && cp <= 0x303F)) return false;
  return true;
}

// LAMBADA: {"text": passage}. The prompt is the passage up to the whitespace before its last
// word; the gold answer is that word by the word rule.
std::vector<Item> lambada_items(const std::string& path) {
  const auto rows = read_jsonl(path);
  std::vector<Item> items;
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string where = path + ":" + std::to_string(i + 1);
    std::string text = str(rows[i], "text", where);
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    const size_t ws = text.find_last_of(" \t\n\r\f\v");
    if (ws == std::string::npos) throw Error(where + ": the passage is a single word");
    size_t context_end = ws;
    while (context_end > 0 && std::isspace(static_cast<unsigned char>(text[context_end - 1])))
      --context_end;
    const auto gold = extract_word(std::string_view(text).substr(ws + 1));
    if (!gold) {
      throw Error(where + ": the passage's last word '" + text.substr(ws + 1) +
                  "' holds no word to predict");
    }
    Item it;
    it.id = "lambada-" + std::to_string(i);
    it.question = text.substr(0, context_end);
    it.gold = *gold;
    items.push_back(std::move(it));
  }
  return items;
}

}  // namespace

std::vector<std::string> task_names() {
  return {"csqa", "csqa-train", "arc-easy", "arc-challenge", "piqa", "gsm8k", "lambada"};
}

int default_shots(const std::string& name) {
  return name == "lambada" ? 0 : 5;
}

WordSpan find_word(std::string_view text) {
  WordSpan w;
  size_t i = 0;
  // Before the word: whitespace and opening marks only.
  while (i < text.size()) {
    const Utf8Char c = utf8_at(text, i);
    if (c.len == 0) return w;
    if (is_word_char(c.cp)) break;
    if (!is_space(c.cp) && !is_opening_mark(c.cp)) {
      w.begin = w.end = i;
      w.refused = w.complete = true;
      return w;
    }
    i += c.len;
  }
  w.begin = w.end = i;
  // The word: word characters, and apostrophes between two of them.
  while (i < text.size()) {
    const Utf8Char c = utf8_at(text, i);
    if (c.len == 0) return w;
    if (is_word_char(c.cp)) {
      i += c.len;
      w.end = i;
      continue;
    }
    if (is_apostrophe(c.cp) && w.end > w.begin) {
      if (i + c.len >= text.size()) return w;  // what follows is not written yet
      const Utf8Char next = utf8_at(text, i + c.len);
      if (next.len == 0) return w;
      if (is_word_char(next.cp)) {
        i += c.len;
        continue;
      }
    }
    w.complete = w.end > w.begin;
    return w;
  }
  return w;
}

std::optional<std::string> extract_word(std::string_view text) {
  const WordSpan w = find_word(text);
  if (w.refused || w.end == w.begin) return std::nullopt;
  return std::string(text.substr(w.begin, w.end - w.begin));
}

namespace {

// What a task's loader reads besides the Task's own fields: the items in file order, the shots
// when the loader picks them itself (csqa), and GSM8K's worked solutions (worked[i] for the
// i-th item).
struct LoadedItems {
  std::vector<Item> items, shot_items;
  std::vector<std::string> worked;
};

// csqa evaluates the dev split; csqa-train the train split's items (less the shots) under the
// same header, for router training (`tandem router collect --task csqa-train`). Shots come
// from the train split either way.
void load_csqa(Task& t, const std::string& data_dir, int shots, LoadedItems& l) {
  const std::string& name = t.name;
  t.shots_from = data_dir + "/commonsenseqa/train_rand_split.jsonl";
  t.source = name == "csqa" ? data_dir + "/commonsenseqa/dev_rand_split.jsonl" : t.shots_from;
  const auto train = read_jsonl(t.shots_from);
  std::vector<bool> is_shot(train.size(), false);
  if (shots > 0) {
    // Spread over the file, so the shots' answer letters are not all alike.
    for (int s = 0; s < shots; ++s) {
      const size_t i = (static_cast<size_t>(s) * 1931 + 7) % train.size();
      is_shot[i] = true;
      l.shot_items.push_back(mc_item(train[i], t.shots_from + ":" + std::to_string(i + 1)));
    }
  }
  const auto rows = name == "csqa" ? read_jsonl(t.source) : train;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (name == "csqa-train" && is_shot[i]) continue;
    l.items.push_back(mc_item(rows[i], t.source + ":" + std::to_string(i + 1)));
  }
  t.header =
      "The following are multiple choice questions about common sense. Answer with the "
      "letter of the correct choice.\n\n";
}

void load_arc(Task& t, const std::string& data_dir, LoadedItems& l) {
  t.source = data_dir +
             (t.name == "arc-easy" ? "/arc/ARC-Easy-Dev.jsonl" : "/arc/ARC-Challenge-Dev.jsonl");
  t.shots_from = t.source + " (first items, not evaluated)";
  const auto rows = read_jsonl(t.source);
  for (size_t i = 0; i < rows.size(); ++i)
    l.items.push_back(mc_item(rows[i], t.source + ":" + std::to_string(i + 1)));
  t.header =
      "The following are multiple choice questions about science. Answer with the letter "
      "of the correct choice.\n\n";
}

// PIQA's labels live in a separate file, one 0 or 1 per line of valid.jsonl.
void load_piqa(Task& t, const std::string& data_dir, LoadedItems& l) {
  t.source = data_dir + "/piqa/valid.jsonl";
  t.shots_from = t.source + " (first items, not evaluated)";
  const auto rows = read_jsonl(t.source);
  std::ifstream labels(data_dir + "/piqa/valid-labels.lst");
  if (!labels) throw Error("cannot read " + data_dir + "/piqa/valid-labels.lst");
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string where = t.source + ":" + std::to_string(i + 1);
    std::string lab;
    if (!std::getline(labels, lab) || (lab != "0" && lab != "1")) {
      throw Error(data_dir + "/piqa/valid-labels.lst:" + std::to_string(i + 1) +
                  ": expected 0 or 1");
    }
    Item it;
    it.id = "piqa-" + std::to_string(i);
    it.labels = {"A", "B"};
    it.gold = lab == "0" ? "A" : "B";
    it.question = mc_question(str(rows[i], "goal", where), it.labels,
                              {str(rows[i], "sol1", where), str(rows[i], "sol2", where)});
    l.items.push_back(std::move(it));
  }
  t.header =
      "The following are questions about physical common sense, each with two solutions. "
      "Answer with the letter of the better solution.\n\n";
}

// GSM8K: the gold is the number after "####"; the whole solution is kept for shots.
void load_gsm8k(Task& t, const std::string& data_dir, LoadedItems& l) {
  t.kind = TaskKind::Numeric;
  t.max_answer_tokens = 256;
  t.source = data_dir + "/gsm8k/test.jsonl";
  t.shots_from = t.source + " (first items, not evaluated)";
  const auto rows = read_jsonl(t.source);
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string where = t.source + ":" + std::to_string(i + 1);
    Item it;
    it.id = "gsm8k-" + std::to_string(i);
    it.question = "Question: " + str(rows[i], "question", where) + "\nAnswer:";
    const std::string answer = str(rows[i], "answer", where);
    auto gold = extract_number(answer);
    if (!gold) throw Error(where + ": the answer has no '#### <number>' line");
    it.gold = *gold;
    it.reference = answer;
    l.worked.push_back(answer);
    l.items.push_back(std::move(it));
  }
  t.header = "Solve the math word problems. End each solution with '#### ' and the number.\n\n";
}

// Every task but csqa takes its shots from its own first items (at most half of them), which
// are then not evaluated. The shots' text follows the header.
void add_shots(Task& t, int shots, LoadedItems& l) {
  if (t.name != "csqa" && t.name != "csqa-train") {
    const size_t k = std::min<size_t>(static_cast<size_t>(shots), l.items.size() / 2);
    l.shot_items.assign(l.items.begin(), l.items.begin() + static_cast<std::ptrdiff_t>(k));
    l.items.erase(l.items.begin(), l.items.begin() + static_cast<std::ptrdiff_t>(k));
  }
  for (size_t s = 0; s < l.shot_items.size(); ++s) {
    t.header += shot_text(l.shot_items[s], t.kind, t.kind == TaskKind::Numeric ? l.worked[s] : "");
  }
}

}  // namespace

Task load_task(const std::string& name, const std::string& data_dir, int shots) {
  if (shots < 0 || shots > 32)
    throw Error("--shots " + std::to_string(shots) + " is outside 0..32");
  Task t;
  t.name = name;
  LoadedItems l;
  if (name == "csqa" || name == "csqa-train") {
    load_csqa(t, data_dir, shots, l);
  } else if (name == "arc-easy" || name == "arc-challenge") {
    load_arc(t, data_dir, l);
  } else if (name == "piqa") {
    load_piqa(t, data_dir, l);
  } else if (name == "gsm8k") {
    load_gsm8k(t, data_dir, l);
  } else if (name == "lambada") {
    if (shots > 0) {
      throw Error("lambada is zero-shot (the prompt is the passage itself): --shots " +
                  std::to_string(shots) + " must be 0");
    }
    t.kind = TaskKind::Word;
    t.max_answer_tokens = 8;
    t.source = data_dir + "/lambada/lambada_test.jsonl";
    t.shots_from = "none (zero-shot)";
    t.items = lambada_items(t.source);
    return t;
  } else {
    std::string names;
    for (const auto& n : task_names()) names += (names.empty() ? "" : ", ") + n;
    throw Error("unknown task '" + name + "' (choose from " + names + ")");
  }
  add_shots(t, shots, l);
  t.items = std::move(l.items);
  return t;
}

std::string item_prompt(const Task& task, const Item& item) {
  return task.header + item.question;
}

std::string cut_answer(TaskKind kind, const std::string& output) {
  if (kind == TaskKind::MultipleChoice) return output.substr(0, output.find('\n'));
  if (kind == TaskKind::Word) return output.substr(0, find_word(output).end);
  size_t cut = output.find("\nQuestion:");
  const size_t blank = output.find("\n\n");
  if (blank != std::string::npos && blank < cut) cut = blank;
  return output.substr(0, cut);
}

bool answer_complete(TaskKind kind, const std::string& output) {
  if (kind == TaskKind::Word) return find_word(output).complete;
  return cut_answer(kind, output).size() < output.size();
}

std::optional<std::string> extract_answer(const Task& task, const Item& item,
                                          const std::string& output) {
  switch (task.kind) {
    case TaskKind::MultipleChoice:
      return extract_choice(output, item.labels);
    case TaskKind::Numeric:
      return extract_number(output);
    case TaskKind::Word:
      return extract_word(output);
  }
  return std::nullopt;
}

std::optional<std::string> extract_choice(const std::string& output,
                                          const std::vector<std::string>& labels) {
  size_t i = 0;
  while (i < output.size() && (output[i] == ' ' || output[i] == '\t')) ++i;
  bool paren = false;
  if (i < output.size() && output[i] == '(') {
    paren = true;
    ++i;
  }
  for (const auto& label : labels) {
    if (output.compare(i, label.size(), label) != 0) continue;
    size_t j = i + label.size();
    if (paren) {
      if (j >= output.size() || output[j] != ')') return std::nullopt;
      ++j;
    }
    if (j == output.size()) return label;
    const unsigned char next = static_cast<unsigned char>(output[j]);
    if (std::isalnum(next) || next == '_' || next >= 0x80) return std::nullopt;
    return label;
  }
  return std::nullopt;
}

std::optional<std::string> normalize_number(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == ',' || c == '$' || c == ' ') continue;
    out += c;
  }
  while (!out.empty() && out.back() == '.') out.pop_back();
  if (out.empty()) return std::nullopt;
  size_t i = out[0] == '-' ? 1 : 0;
  if (i == out.size()) return std::nullopt;
  bool dot = false;
  for (size_t k = i; k < out.size(); ++k) {
    if (out[k] == '.') {
      if (dot) return std::nullopt;
      dot = true;
    } else if (!std::isdigit(static_cast<unsigned char>(out[k]))) {
      return std::nullopt;
    }
  }
  if (dot) {
    while (out.back() == '0') out.pop_back();
    if (out.back() == '.') out.pop_back();
  }
  // Leading zeros: "007" -> "7".
  size_t z = i;
  while (z + 1 < out.size() && out[z] == '0' && out[z + 1] != '.') ++z;
  out.erase(i, z - i);
  if (out == "-0") out = "0";
  return out;
}

std::optional<std::string> extract_number(const std::string& output) {
  size_t at = std::string::npos, len = 0;
  for (const std::string marker : {"####", "The answer is", "the answer is"}) {
    const size_t p = output.rfind(marker);
    if (p != std::string::npos && (at == std::string::npos || p > at)) {
      at = p;
      len = marker.size();
    }
  }
  if (at == std::string::npos) return std::nullopt;
  size_t i = at + len;
  while (i < output.size() && (output[i] == ' ' || output[i] == ':' || output[i] == '$')) ++i;
  size_t j = i;
  while (j < output.size() &&
         (std::isdigit(static_cast<unsigned char>(output[j])) || output[j] == ',' ||
          output[j] == '.' || (j == i && output[j] == '-'))) {
    ++j;
  }
  return normalize_number(output.substr(i, j - i));
}

}  // namespace tandem::eval
