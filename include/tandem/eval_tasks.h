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
// HumanEval is zero-shot code completion: the prompt is the problem's function signature and
// docstring, the completion is cut at the first stop sequence (code_stops) and the item is
// correct when the program code_program builds exits 0 in the sandbox (tandem/sandbox.h).
//
// Chat prompts (`tandem eval --chat`, for instruct models) ask the same items as a conversation:
// the task's instruction, the shots as earlier user/assistant turns and the item as the last
// user turn, rendered by the model's own chat template and answered in a form of their own
// ("The answer is (X)", see chat_messages below).
//
// Public (owned by src/eval), for `tandem eval` and `tandem router collect`, which ask or trace
// the tasks' items.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/chat.h"  // ChatMessage

namespace tandem::eval {

enum class TaskKind { MultipleChoice, Numeric, Word, Code };

// LAMBADA's split in this project: passages [0, kLambadaFirstReported) may be used for training,
// calibration and choosing settings; passages from kLambadaFirstReported on only for reporting.
inline constexpr int kLambadaFirstReported = 2576;

struct Item {
  std::string id;
  std::string question;             // the item's own part of the prompt (after the shots)
  std::vector<std::string> labels;  // multiple choice: "A", "B", ...
  std::string gold;                 // a label, or a normalized number
  std::string reference;            // GSM8K: the worked solution, "... #### 72" (as the shots
                                    // show theirs); HumanEval: the canonical solution; empty
                                    // for multiple choice
  std::string test, entry_point;    // HumanEval: "def check(candidate): ..." and the function
};

// HumanEval's gold: the verdict of a program that passed its tests (SandboxResult::verdict).
inline constexpr const char* kCodePassed = "passed";

// How a multiple-choice item is answered in a chat prompt: one short sentence of reason ending
// in "The answer is (X)"; the letter alone; or "The answer is (X) TEXT", the choice's text
// after its letter.
enum class ChatAnswer { Reason, Letter, Choice };

// The chat prompt form of a task (tandem eval --chat); absent from Task::chat: the plain
// completion prompts.
struct ChatForm {
  std::string system;  // the system turn's text; "" for none
  ChatAnswer answer = ChatAnswer::Reason;
};

struct Task {
  std::string name;  // "csqa", "arc-easy", "arc-challenge", "piqa", "gsm8k", "lambada", "humaneval"
  TaskKind kind = TaskKind::MultipleChoice;
  std::string header;  // instruction + the few-shot examples, each ending in a blank line
  std::vector<Item> items;
  int max_answer_tokens = 4;
  std::string source;  // the data file the items come from
  std::string shots_from;
  std::vector<Item> shots;       // the examples in the header, in order
  std::optional<ChatForm> chat;  // set by use_chat_form: items are asked as chat turns
};

// Names accepted by load_task.
std::vector<std::string> task_names();

// Few-shot examples a task takes when none are asked for: 5, and 0 for LAMBADA and HumanEval
// (zero-shot).
int default_shots(const std::string& name);

// Loads a task from `data_dir` (../shared/data) with `shots` examples in the header. Shots come
// from the train split where there is one (CommonsenseQA); otherwise they are the first `shots`
// items of the file, which are then left out of the evaluation. LAMBADA and HumanEval take no
// shots (throw for shots > 0); LAMBADA's items keep their passage index: id "lambada-I" is line
// I + 1; HumanEval's their task ids, "HumanEval/0" to "HumanEval/163". Throws
// tandem::Error naming the file and line of anything malformed.
Task load_task(const std::string& name, const std::string& data_dir, int shots);

// The full prompt of an item: header + question.
std::string item_prompt(const Task& task, const Item& item);

// Asks the task's items as chat turns from now on (Task::chat), with room for the form's
// answer in max_answer_tokens: multiple choice 48 tokens for a reason, 4 for a letter, 24 for a
// choice; 384 for a GSM8K solution; LAMBADA keeps 8. HumanEval has no chat form (throws).
void use_chat_form(Task& task, const ChatForm& form);
// "reason" / "letter"; parse_chat_answer throws tandem::Error naming the choices.
std::string chat_answer_name(ChatAnswer answer);
ChatAnswer parse_chat_answer(const std::string& name);

// An item as a conversation (task.chat must be set), for the model's chat template
// (Model::chat_prompt, then tokenized with parse_special):
//   [system: form.system]                      when given
//   user: INSTRUCTION\n\nSHOT 1's question     the shots as earlier turns, the instruction
//   assistant: SHOT 1's answer                  in the first user turn only
//   user: SHOT 2's question ... assistant: ...
//   user: the item's question                  (INSTRUCTION\n\n before it when no shots)
// A question is the plain prompt's without its "\nAnswer:" cue: "Question: STEM\nA. ..\nE. ..".
// A shot's answer: "The answer is (X)." ("X" in the letter form, "The answer is (X) TEXT." in
// the choice form); a GSM8K shot's worked solution with its <<calculator>> notes removed and
// "#### N" written "The answer is N.".
std::vector<ChatMessage> chat_messages(const Task& task, const Item& item);
// An item's reference answer in its task's chat form, as a shot's answer turn reads (above):
// what `router collect --chat` teacher-forces after the item's chat prompt.
std::string chat_reference_answer(const Task& task, const Item& item);

// Where the output stops being the answer: the first newline for multiple choice, the start of
// a next "Question:" for GSM8K, the end of the first word for LAMBADA, the first of code_stops
// for HumanEval. Returns the output cut there.
std::string cut_answer(TaskKind kind, const std::string& output);
// True once the output so far can no longer change the extracted answer (generation may stop).
bool answer_complete(TaskKind kind, const std::string& output);

// The same for a task's own form, plain or chat (chat: cut_chat_answer below).
std::string cut_answer(const Task& task, const std::string& output);
bool answer_complete(const Task& task, const std::string& output);

// The answer in an output already cut by cut_answer, by the task's kind of extraction below
// (chat prompts: extract_chat_choice for multiple choice). HumanEval: nullopt, a completion is
// judged by running code_program (tandem/sandbox.h), its verdict the answer.
std::optional<std::string> extract_answer(const Task& task, const Item& item,
                                          const std::string& output);

// Chat answers. The assistant's end of turn (the template's EOS/EOT token) ends generation
// before this sees it. A multiple-choice answer is the letter of an answer statement, "The
// answer is" (or "the answer is"), optional ':' and spaces, then a label alone as
// extract_choice reads it: " (B)", "B."; the statement ends at the first '.' after the label,
// or a newline. The output is cut at the end of the first statement (the answer is fixed
// there). Without a statement the whole output must be a label alone ("B", "(B)", "B.", with
// whitespace around). No answer when: a statement's rest names another of the item's labels
// ("(A) or (B)"), two statements differ, the letter is not the item's ("The answer is (F)" of
// five choices), or there is neither. GSM8K: the whole output, extract_number; LAMBADA: the
// word rule, as plain.
std::string cut_chat_answer(TaskKind kind, const std::string& output);
std::optional<std::string> extract_chat_choice(const std::string& output,
                                               const std::vector<std::string>& labels);

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

// HumanEval's stop sequences, each at a line start (the prompt ends with a newline): a new
// top-level def, class, if __name__, print( or comment ends the function's body.
const std::vector<std::string>& code_stops();
// The program that judges a completion: prompt + completion + "\n" + test + "\n" +
// "check(ENTRY_POINT)\n"; it exits 0 when the completion passes the problem's tests.
std::string code_program(const Item& item, const std::string& completion);

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
