// Evaluation tasks from ../shared/data: multiple-choice (CommonsenseQA, ARC-Easy,
// ARC-Challenge, PIQA) and free-form (GSM8K), as few-shot prompts and strict answer extraction.
//
// A task's items are asked as completions: the few-shot block (the same for every item, so a
// session's KV and a stateless server's prefix cache are reused) followed by the item's question
// and "Answer:". The model's output is cut at the first newline (multiple choice) or at the next
// "Question:" (GSM8K), and the answer is extracted strictly: a multiple-choice answer must be one
// of the item's labels standing alone; a GSM8K answer must follow "####" or "The answer is".
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tandem::eval {

enum class TaskKind { MultipleChoice, Numeric };

struct Item {
  std::string id;
  std::string question;             // the item's own part of the prompt (after the shots)
  std::vector<std::string> labels;  // multiple choice: "A", "B", ...
  std::string gold;                 // a label, or a normalized number
  std::string reference;            // GSM8K: the worked solution, "... #### 72" (as the shots
                                    // show theirs); empty for multiple choice
};

struct Task {
  std::string name;  // "csqa", "arc-easy", "arc-challenge", "piqa", "gsm8k"
  TaskKind kind = TaskKind::MultipleChoice;
  std::string header;  // instruction + the few-shot examples, each ending in a blank line
  std::vector<Item> items;
  int max_answer_tokens = 4;
  std::string source;  // the data file the items come from
  std::string shots_from;
};

// Names accepted by load_task.
std::vector<std::string> task_names();

// Loads a task from `data_dir` (../shared/data) with `shots` examples in the header. Shots come
// from the train split where there is one (CommonsenseQA); otherwise they are the first `shots`
// items of the file, which are then left out of the evaluation. Throws tandem::Error naming the
// file and line of anything malformed.
Task load_task(const std::string& name, const std::string& data_dir, int shots);

// The full prompt of an item: header + question.
std::string item_prompt(const Task& task, const Item& item);

// Where the output stops being the answer: the first newline for multiple choice, the start of
// a next "Question:" for GSM8K. Returns the output cut there.
std::string cut_answer(TaskKind kind, const std::string& output);
// True once the output so far can no longer change the extracted answer (generation may stop).
bool answer_complete(TaskKind kind, const std::string& output);

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

}  // namespace tandem::eval
