#include "tandem/eval_tasks.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

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

// HumanEval: {"task_id", "prompt", "entry_point", "canonical_solution", "test"}. The prompt is
// asked as it is (it ends with a newline after the docstring).
std::vector<Item> humaneval_items(const std::string& path) {
  const auto rows = read_jsonl(path);
  std::vector<Item> items;
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string where = path + ":" + std::to_string(i + 1);
    Item it;
    it.id = str(rows[i], "task_id", where);
    it.question = str(rows[i], "prompt", where);
    it.reference = str(rows[i], "canonical_solution", where);
    it.test = str(rows[i], "test", where);
    it.entry_point = str(rows[i], "entry_point", where);
    it.gold = kCodePassed;
    if (it.entry_point.empty()) throw Error(where + ": field 'entry_point' is empty");
    items.push_back(std::move(it));
  }
  return items;
}

}  // namespace

std::vector<std::string> task_names() {
  return {"csqa", "csqa-train", "arc-easy", "arc-challenge",
          "piqa", "gsm8k",      "lambada",  "humaneval"};
}

int default_shots(const std::string& name) {
  return name == "lambada" || name == "humaneval" ? 0 : 5;
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
  t.shots = std::move(l.shot_items);
}

// A zero-shot task (LAMBADA, HumanEval): no header and no shots (refused, saying why: `what`).
void zero_shot(Task& t, int shots, const std::string& what, TaskKind kind, int max_answer_tokens,
               const std::string& source) {
  if (shots > 0) {
    throw Error(t.name + " is zero-shot (" + what + "): --shots " + std::to_string(shots) +
                " must be 0");
  }
  t.kind = kind;
  t.max_answer_tokens = max_answer_tokens;
  t.source = source;
  t.shots_from = "none (zero-shot)";
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
    zero_shot(t, shots, "the prompt is the passage itself", TaskKind::Word, 8,
              data_dir + "/lambada/lambada_test.jsonl");
    t.items = lambada_items(t.source);
    return t;
  } else if (name == "humaneval") {
    zero_shot(t, shots, "the prompt is the function to complete", TaskKind::Code, 384,
              data_dir + "/humaneval/HumanEval.jsonl");
    t.items = humaneval_items(t.source);
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

namespace {

// The chat form's instruction: the task, and how to answer.
std::string chat_instruction(const Task& t) {
  if (t.kind == TaskKind::Word) {
    return "Write the word that comes next at the end of this passage. Reply with that one word "
           "only.";
  }
  if (t.kind == TaskKind::Numeric) {
    return "Solve the math word problem. Reason step by step, briefly, then end with \"The "
           "answer is N\", N the number.";
  }
  const std::string what = t.name == "piqa" ? "Choose the better solution to the goal."
                           : t.name.rfind("arc", 0) == 0
                               ? "Answer the multiple choice question about science."
                               : "Answer the multiple choice question about common sense.";
  if (t.chat->answer == ChatAnswer::Letter) return what + " Reply with the letter only.";
  if (t.chat->answer == ChatAnswer::Choice) {
    return what + " Reply with \"The answer is (X)\" and the text of choice X, X the letter.";
  }
  return what +
         " Give one short sentence of reasoning, then end with \"The answer is (X)\", X the "
         "letter.";
}

// The item's question as a chat turn: the plain prompt's without its "Answer:" cue.
std::string chat_question(const Item& item) {
  static const std::string cue = "\nAnswer:";
  const std::string& q = item.question;
  if (q.size() >= cue.size() && q.compare(q.size() - cue.size(), cue.size(), cue) == 0)
    return q.substr(0, q.size() - cue.size());
  return q;
}

// "Natalia sold 48/2 = <<48/2=24>>24 clips ... #### 72" -> "... 24 clips ... The answer is 72."
std::string chat_worked_solution(const std::string& reference) {
  std::string out;
  for (size_t i = 0; i < reference.size(); ++i) {
    const size_t close = reference.compare(i, 2, "<<") == 0 ? reference.find(">>", i) : i;
    if (close != i && close != std::string::npos) {
      i = close + 1;
      continue;
    }
    out += reference[i];
  }
  const size_t hashes = out.rfind("####");
  if (hashes == std::string::npos) return out;
  const auto number = extract_number(out.substr(hashes));
  return out.substr(0, hashes) + "The answer is " + number.value_or("") + ".";
}

// The text of a multiple-choice item's choice: "refrigerator" for "\nB. refrigerator\n".
std::string choice_text(const Item& item, const std::string& label) {
  const std::string line = "\n" + label + ". ";
  const size_t at = item.question.find(line);
  if (at == std::string::npos) return "";
  const size_t begin = at + line.size();
  return item.question.substr(begin, item.question.find('\n', begin) - begin);
}

// A shot's answer turn in the task's chat form.
std::string chat_shot_answer(const Task& t, const Item& shot) {
  if (t.kind == TaskKind::Numeric) return chat_worked_solution(shot.reference);
  if (t.kind == TaskKind::Word) return shot.gold;
  if (t.chat->answer == ChatAnswer::Letter) return shot.gold;
  if (t.chat->answer == ChatAnswer::Choice)
    return "The answer is (" + shot.gold + ") " + choice_text(shot, shot.gold) + ".";
  return "The answer is (" + shot.gold + ").";
}

}  // namespace

void use_chat_form(Task& task, const ChatForm& form) {
  if (task.kind == TaskKind::Code) {
    throw Error("--chat: " + task.name +
                " is asked as a plain completion of the function's prompt; it has no chat form");
  }
  task.chat = form;
  if (task.kind == TaskKind::Numeric) task.max_answer_tokens = 384;
  if (task.kind == TaskKind::MultipleChoice)
    task.max_answer_tokens = form.answer == ChatAnswer::Reason   ? 48
                             : form.answer == ChatAnswer::Choice ? 24
                                                                 : 4;
}

std::string chat_answer_name(ChatAnswer answer) {
  switch (answer) {
    case ChatAnswer::Reason:
      return "reason";
    case ChatAnswer::Letter:
      return "letter";
    case ChatAnswer::Choice:
      return "choice";
  }
  return "reason";
}

ChatAnswer parse_chat_answer(const std::string& name) {
  if (name == "reason") return ChatAnswer::Reason;
  if (name == "letter") return ChatAnswer::Letter;
  if (name == "choice") return ChatAnswer::Choice;
  throw Error("chat answer form '" + name + "' is not reason, letter or choice");
}

std::string chat_reference_answer(const Task& task, const Item& item) {
  if (!task.chat) throw Error("chat_reference_answer: task " + task.name + " has no chat form");
  return chat_shot_answer(task, item);
}

std::vector<ChatMessage> chat_messages(const Task& task, const Item& item) {
  if (!task.chat) throw Error("chat_messages: task " + task.name + " has no chat form");
  std::vector<ChatMessage> msgs;
  if (!task.chat->system.empty()) msgs.push_back({"system", task.chat->system});
  std::string instruction = chat_instruction(task) + "\n\n";
  for (const Item& shot : task.shots) {
    msgs.push_back({"user", std::exchange(instruction, "") + chat_question(shot)});
    msgs.push_back({"assistant", chat_shot_answer(task, shot)});
  }
  msgs.push_back({"user", instruction + chat_question(item)});
  return msgs;
}

const std::vector<std::string>& code_stops() {
  static const std::vector<std::string> stops = {"\ndef ", "\nclass ", "\nif __name__", "\nprint(",
                                                 "\n#"};
  return stops;
}

std::string code_program(const Item& item, const std::string& completion) {
  // Appended piece by piece (GCC 12 warns, wrongly, on a chain of string + literal + string).
  std::string program = item.question;
  for (const std::string* piece : {&completion, &item.test}) {
    program += *piece;
    program += '\n';
  }
  program += "check(";
  program += item.entry_point;
  program += ")\n";
  return program;
}

std::string cut_answer(TaskKind kind, const std::string& output) {
  if (kind == TaskKind::MultipleChoice) return output.substr(0, output.find('\n'));
  if (kind == TaskKind::Code) {
    size_t cut = output.size();
    for (const std::string& stop : code_stops()) cut = std::min(cut, output.find(stop));
    return output.substr(0, cut);
  }
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

std::string cut_answer(const Task& task, const std::string& output) {
  return task.chat ? cut_chat_answer(task.kind, output) : cut_answer(task.kind, output);
}

bool answer_complete(const Task& task, const std::string& output) {
  if (task.kind == TaskKind::Word) return find_word(output).complete;
  return cut_answer(task, output).size() < output.size();
}

std::optional<std::string> extract_answer(const Task& task, const Item& item,
                                          const std::string& output) {
  switch (task.kind) {
    case TaskKind::MultipleChoice:
      return task.chat ? extract_chat_choice(output, item.labels)
                       : extract_choice(output, item.labels);
    case TaskKind::Numeric:
      return extract_number(output);
    case TaskKind::Word:
      return extract_word(output);
    case TaskKind::Code:
      return std::nullopt;  // judged by running it (code_program, tandem/sandbox.h)
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

namespace {

bool is_alnum(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
}

// One answer statement in a chat answer: "The answer is (B) bank." -> letter 'B', rest " bank"
// (output[rest_begin, end)), ended at the '.' (end = its offset; ended false when the output
// stops before a '.' or newline).
struct Statement {
  char letter = 0;
  size_t rest_begin = 0, end = 0;
  bool ended = false;
};

// The statement whose marker ends at `i`, if a letter alone follows it.
std::optional<Statement> statement_at(const std::string& out, size_t i) {
  while (i < out.size() && (out[i] == ' ' || out[i] == ':')) ++i;
  const bool paren = i < out.size() && out[i] == '(';
  i += paren;
  if (i >= out.size() || out[i] < 'A' || out[i] > 'Z') return std::nullopt;
  Statement st;
  st.letter = out[i++];
  if (paren && (i >= out.size() || out[i++] != ')')) return std::nullopt;
  if (i < out.size() && is_alnum(out[i])) return std::nullopt;
  st.rest_begin = i;
  st.end = std::min(out.find('.', i), out.find('\n', i));
  st.ended = st.end != std::string::npos;
  if (!st.ended) st.end = out.size();
  return st;
}

// Every answer statement of a chat answer, in order.
std::vector<Statement> answer_statements(const std::string& out) {
  std::vector<Statement> found;
  for (size_t at = 0; at < out.size(); ++at) {
    for (const std::string_view marker : {"The answer is", "the answer is"}) {
      if (out.compare(at, marker.size(), marker) != 0) continue;
      if (auto st = statement_at(out, at + marker.size())) found.push_back(*st);
    }
  }
  return found;
}

bool is_label(char c, const std::vector<std::string>& labels) {
  return std::find(labels.begin(), labels.end(), std::string(1, c)) != labels.end();
}

// Whether text names one of the labels other than `letter` as a letter standing alone.
bool names_other_label(std::string_view text, char letter, const std::vector<std::string>& labels) {
  for (size_t i = 0; i < text.size(); ++i) {
    const bool alone =
        (i == 0 || !is_alnum(text[i - 1])) && (i + 1 == text.size() || !is_alnum(text[i + 1]));
    if (alone && text[i] != letter && is_label(text[i], labels)) return true;
  }
  return false;
}

}  // namespace

std::string cut_chat_answer(TaskKind kind, const std::string& output) {
  if (kind == TaskKind::Word) return cut_answer(kind, output);
  if (kind == TaskKind::Numeric) return output;
  for (const Statement& st : answer_statements(output)) {
    if (st.ended) return output.substr(0, st.end);
  }
  return output;
}

std::optional<std::string> extract_chat_choice(const std::string& output,
                                               const std::vector<std::string>& labels) {
  const std::vector<Statement> statements = answer_statements(output);
  if (statements.empty()) {
    // A letter alone: "B", "(B)", "B." or "B)", whitespace around.
    const size_t b = output.find_first_not_of(" \t\r\n");
    const size_t e = output.find_last_not_of(" \t\r\n");
    if (b == std::string::npos) return std::nullopt;
    const std::string alone = output.substr(b, e + 1 - b);
    for (const std::string& l : labels) {
      if (alone == l || alone == "(" + l + ")" || alone == l + "." || alone == l + ")") return l;
    }
    return std::nullopt;
  }
  const char letter = statements.front().letter;
  for (const Statement& st : statements) {
    const std::string_view rest(output.data() + st.rest_begin, st.end - st.rest_begin);
    if (st.letter != letter || names_other_label(rest, letter, labels)) return std::nullopt;
  }
  if (!is_label(letter, labels)) return std::nullopt;
  return std::string(1, letter);
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
