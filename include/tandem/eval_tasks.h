// Evaluation tasks from ../shared/data: multiple-choice (CommonsenseQA, ARC-Easy,
// ARC-Challenge, PIQA), free-form (GSM8K) and last-word prediction (LAMBADA), as prompts and
// strict answer extraction.
//
// A task's items are asked as completions: the few-shot block (the same for every item, so a
// session's KV and a stateless server's prefix cache are reused) followed by the item's question
// and "Answer:". The model's output is cut at the first newline (multiple choice) or at the next
// "Question:" (GSM8K), and the answer is extracted strictly: a multiple-choice answer must be one
// of the item's labels standing alone; a GSM8K answer must follow "####" or "The answer is".
//
// LAMBADA is zero-shot: the prompt is the passage up to its last word, and the answer is the
// first word the model writes (the word rule below), compared exactly with the passage's own.
//
// Public (owned by src/eval), for `tandem eval` and `tandem router collect`, which ask or trace
// the tasks' items.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::eval {

enum class TaskKind { MultipleChoice, Numeric, Word };

// LAMBADA's split in this project: passages [0, kLambadaFirstReported) may be used for training,
// calibration and choosing settings; passages from kLambadaFirstReported on only for reporting.
inline constexpr int kLambadaFirstReported = 2576;

struct Item {
  std::string id;
  std::string question;             // the item's own part of the prompt (after the shots)
  std::vector<std::string> labels;  // multiple choice: "A", "B", ...
  std::string gold;                 // a label, or a normalized number
  std::string reference;            // GSM8K: the worked solution, "... #### 72" (as the shots
                                    // show theirs); empty for multiple choice
};

struct Task {
  std::string name;  // "csqa", "arc-easy", "arc-challenge", "piqa", "gsm8k", "lambada"
  TaskKind kind = TaskKind::MultipleChoice;
  std::string header;  // instruction + the few-shot examples, each ending in a blank line
  std::vector<Item> items;
  int max_answer_tokens = 4;
  std::string source;  // the data file the items come from
  std::string shots_from;
};

// Names accepted by load_task.
std::vector<std::string> task_names();

// Few-shot examples a task takes when none are asked for: 5, and 0 for LAMBADA (zero-shot).
int default_shots(const std::string& name);

// Loads a task from `data_dir` (../shared/data) with `shots` examples in the header. Shots come
// from the train split where there is one (CommonsenseQA); otherwise they are the first `shots`
// items of the file, which are then left out of the evaluation. LAMBADA takes no shots (throws
// for shots > 0), and its items keep their passage index: id "lambada-I" is line I + 1. Throws
// tandem::Error naming the file and line of anything malformed.
Task load_task(const std::string& name, const std::string& data_dir, int shots);

// The full prompt of an item: header + question.
std::string item_prompt(const Task& task, const Item& item);

// Where the output stops being the answer: the first newline for multiple choice, the start of
// a next "Question:" for GSM8K, the end of the first word for LAMBADA. Returns the output cut
// there.
std::string cut_answer(TaskKind kind, const std::string& output);
// True once the output so far can no longer change the extracted answer (generation may stop).
bool answer_complete(TaskKind kind, const std::string& output);

// The answer in an output already cut by cut_answer, by the task's kind of extraction below.
std::optional<std::string> extract_answer(const Task& task, const Item& item,
                                          const std::string& output);

// Strict extraction; nullopt when the output holds no valid answer.
//  multiple choice: after optional spaces, one of `labels` alone, optionally in parentheses or
//  followed by '.', ')' or ':', then the end or a non-alphanumeric character. " B" -> B,
//  "(C) because" -> C, " Bob" -> none, "" -> none.
//  numeric: the number after the last "####" or "The answer is", commas, '$' and a trailing '.'
//  removed, "-3.50" -> "-3.5", "12.0" -> "12".
std::optional<std::string> extract_choice(const std::string& output,
                                          const std::vector<std::string>& labels);
std::optional<std::string> extract_number(const std::string& output);
std::optional<std::string> normalize_number(std::string s);

// The word rule (LAMBADA). Leading whitespace and opening marks (" ' ( [ and the curly quotes)
// come before the word and are skipped; the word is then the longest run of word characters:
// letters and digits (any non-ASCII character outside U+00A0..U+00BF and U+2000..U+206F counts
// as a letter), and an apostrophe (' or U+2019) between two of them. The word ends at the first
// other character — whitespace or punctuation — so a generation may stop as soon as a token
// starting with either arrives. Any other character before the word means there is no word.
struct WordSpan {
  size_t begin = 0, end = 0;  // the word is text[begin, end)
  bool complete = false;      // a character after the word shows it has ended
  bool refused = false;       // a character before any word that may not start an answer
};
WordSpan find_word(std::string_view text);
// The first word of `text` by the rule above; nullopt when there is none. Exact-match scoring
// compares extract_word(output) with extract_word(gold) byte for byte.
std::optional<std::string> extract_word(std::string_view text);

}  // namespace tandem::eval
