// A tokenizer from a GGUF file's tokenizer.* keys: the model kind, the tokens with their scores
// and types, merges, the special ids (read, else detected by their texts) and the
// end-of-generation set, as llama.cpp's vocabulary loader reads them.
#include <algorithm>
#include <cctype>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace tandem {

namespace {

uint32_t type_to_attr(int64_t t) {
  switch (t) {
    case 1:
      return kAttrNormal;
    case 2:
      return kAttrUnknown;
    case 3:
      return kAttrControl;
    case 4:
      return kAttrUserDefined;
    case 5:
      return kAttrUnused;
    case 6:
      return kAttrByte;
    default:
      return kAttrUndefined;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Loading

namespace {

std::optional<TokenId> read_id(const GgufFile& f, std::string_view key) {
  const auto v = f.get_u64_opt(key);
  if (!v) return std::nullopt;
  if (*v > static_cast<uint64_t>(INT32_MAX)) return std::nullopt;
  return static_cast<TokenId>(*v);
}

// from_gguf reads the vocabulary in the order llama.cpp's loader does, one step per function
// below; later steps read what earlier ones set (defaults, then texts, then special ids), so
// their order is part of the behaviour. `where` (" in <path>") ends every error message.

// The gpt2 merges, copied into one arena: merges[i] is the view "left right" of rank i.
void load_merges(TokenizerImpl& v, const GgufFile& f, const std::string& where) {
  if (!f.has("tokenizer.ggml.merges"))
    throw Error("tokenizer: missing key tokenizer.ggml.merges (required for gpt2 vocab)" + where);
  const auto& merges = f.get_string_array("tokenizer.ggml.merges");
  size_t total = 0;
  for (auto m : merges) total += m.size();
  v.merge_arena.reserve(total);
  for (auto m : merges) v.merge_arena.append(m);
  v.merges.reserve(merges.size());
  size_t off = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string_view m(v.merge_arena.data() + off, merges[i].size());
    off += m.size();
    v.merges.push_back(m);
  }
  // Without a space llama.cpp stores the pair ("", ""), which never matches: skip those.
  std::vector<uint8_t> skip(v.merges.size());
  for (size_t i = 0; i < v.merges.size(); ++i)
    skip[i] = v.merges[i].find(' ', 1) == std::string_view::npos;
  v.merge_rank.build_all(&v.merges, /*overwrite=*/false, &skip);
}

// tokenizer.ggml.model picks the algorithm and the defaults that metadata may override later.
void load_model_kind(TokenizerImpl& v, const GgufFile& f, const std::string& where) {
  const auto model = f.get_string_opt("tokenizer.ggml.model");
  if (!model) throw Error("tokenizer: missing key tokenizer.ggml.model" + where);
  v.model.assign(*model);
  v.pre.assign(f.get_string_opt("tokenizer.ggml.pre").value_or(""));

  if (v.model == "llama") {
    v.kind = TokenizerImpl::Kind::SPM;
    v.bos = 1;
    v.eos = 2;
    v.unk = 0;
    v.add_space_prefix = true;
    v.add_bos = true;
    v.add_eos = false;
    v.clean_spaces = false;
  } else if (v.model == "gpt2") {
    v.kind = TokenizerImpl::Kind::BPE;
    v.bos = 11;
    v.eos = 11;
    v.unk = -1;
    v.add_space_prefix = false;
    v.clean_spaces = true;
    v.pre_type = pre_type_from_name(v.pre);
    if (v.pre_type == PreType::LLAMA3) {
      v.ignore_merges = true;
      v.add_bos = true;
    } else if (v.pre_type == PreType::QWEN2) {
      v.clean_spaces = false;
    }
    load_merges(v, f, where);
    v.pretok = std::make_unique<PreTokenizer>(v.pre_type);
  } else {
    throw Error("tokenizer: unsupported tokenizer.ggml.model '" + v.model + "'" + where +
                " (supported: llama, gpt2)");
  }
  if (auto b = f.find("tokenizer.ggml.add_space_prefix")) {
    (void)b;
    v.add_space_prefix = f.get_bool_or("tokenizer.ggml.add_space_prefix", v.add_space_prefix);
  }
}

// Scores and token types, each at least n long (extra entries are ignored, as llama.cpp does).
void load_scores_and_types(TokenizerImpl& v, const GgufFile& f, size_t n,
                           const std::string& where) {
  if (f.has("tokenizer.ggml.scores")) {
    v.scores = f.get_f32_array("tokenizer.ggml.scores");
    if (v.scores.size() < n)
      throw Error("tokenizer: tokenizer.ggml.scores has " + std::to_string(v.scores.size()) +
                  " entries, expected " + std::to_string(n) + where);
    v.scores.resize(n);
  }
  v.attrs.assign(n, kAttrNormal);
  v.types.assign(n, 1);
  if (f.has("tokenizer.ggml.token_type")) {
    const auto types = f.get_int_array("tokenizer.ggml.token_type");
    if (types.size() < n)
      throw Error("tokenizer: tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                  " entries, expected " + std::to_string(n) + where);
    for (size_t i = 0; i < n; ++i) {
      v.attrs[i] = type_to_attr(types[i]);
      v.types[i] = static_cast<uint8_t>(types[i] >= 0 && types[i] <= 6 ? types[i] : 0);
    }
  }
}

// Token texts copied into one arena (an empty text becomes "[EMPTY_<id>]", as in llama.cpp);
// texts[id] views it, token_to_id maps back (a later duplicate wins).
void build_texts(TokenizerImpl& v, const std::vector<std::string_view>& tokens) {
  const size_t n = tokens.size();
  size_t total = 0;
  for (size_t i = 0; i < n; ++i)
    total += tokens[i].empty() ? 8 + std::to_string(i).size() : tokens[i].size();
  v.text_arena.reserve(total);
  std::vector<std::pair<size_t, size_t>> spans(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t start = v.text_arena.size();
    if (tokens[i].empty()) {
      v.text_arena += "[EMPTY_" + std::to_string(i) + "]";
    } else {
      v.text_arena.append(tokens[i]);
    }
    spans[i] = {start, v.text_arena.size() - start};
  }
  v.texts.resize(n);
  for (size_t i = 0; i < n; ++i) {
    v.texts[i] = std::string_view(v.text_arena.data() + spans[i].first, spans[i].second);
    v.max_token_len = std::max(v.max_token_len, v.texts[i].size());
  }
  v.token_to_id.build_all(&v.texts, /*overwrite=*/true);
}

// Tokens, scores, types; returns the vocabulary size n (1 <= n <= INT32_MAX).
size_t load_tokens(TokenizerImpl& v, const GgufFile& f, const std::string& where) {
  if (!f.has("tokenizer.ggml.tokens"))
    throw Error("tokenizer: missing key tokenizer.ggml.tokens" + where);
  const auto& tokens = f.get_string_array("tokenizer.ggml.tokens");
  const size_t n = tokens.size();
  if (n == 0) throw Error("tokenizer: tokenizer.ggml.tokens is empty" + where);
  if (n > static_cast<size_t>(INT32_MAX))
    throw Error("tokenizer: too many tokens (" + std::to_string(n) + ")" + where);
  load_scores_and_types(v, f, n, where);
  build_texts(v, tokens);
  return n;
}

// Special ids from metadata (out-of-range ids are ignored, as llama.cpp does).
void read_special_ids(TokenizerImpl& v, const GgufFile& f, size_t n) {
  const std::pair<const char*, TokenId*> keys[] = {
      {"tokenizer.ggml.bos_token_id", &v.bos},
      {"tokenizer.ggml.eos_token_id", &v.eos},
      {"tokenizer.ggml.eot_token_id", &v.eot},
      {"tokenizer.ggml.eom_token_id", &v.eom},
      {"tokenizer.ggml.unknown_token_id", &v.unk},
      {"tokenizer.ggml.seperator_token_id", &v.sep},
      {"tokenizer.ggml.padding_token_id", &v.pad},
      {"tokenizer.ggml.mask_token_id", &v.mask},
      {"tokenizer.ggml.fim_pre_token_id", &v.fim_pre},
      {"tokenizer.ggml.fim_suf_token_id", &v.fim_suf},
      {"tokenizer.ggml.fim_mid_token_id", &v.fim_mid},
      {"tokenizer.ggml.fim_pad_token_id", &v.fim_pad},
      {"tokenizer.ggml.fim_rep_token_id", &v.fim_rep},
      {"tokenizer.ggml.fim_sep_token_id", &v.fim_sep},
      {"tokenizer.ggml.prefix_token_id", &v.fim_pre},
      {"tokenizer.ggml.suffix_token_id", &v.fim_suf},
      {"tokenizer.ggml.middle_token_id", &v.fim_mid},
  };
  for (const auto& [key, dst] : keys) {
    const auto id = read_id(f, key);
    if (id && static_cast<size_t>(*id) < n) *dst = *id;
  }
  for (TokenId* id : {&v.bos, &v.eos, &v.unk})
    if (*id >= static_cast<TokenId>(n)) *id = -1;
  v.add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", v.add_bos);
  v.add_eos = f.get_bool_or("tokenizer.ggml.add_eos_token", v.add_eos);
}

void force_control(TokenizerImpl& v, TokenId id) {
  v.attrs[id] |= kAttrControl;
}

// Sets dst (when metadata left it unset) to the first of names present in the vocabulary.
void detect_special(TokenizerImpl& v, TokenId& dst, std::initializer_list<std::string_view> names) {
  if (dst >= 0) return;
  for (auto name : names) {
    const TokenId id = v.text_to_token(name);
    if (id >= 0) {
      dst = id;
      force_control(v, id);
      return;
    }
  }
}

// Special tokens recognised by their text (llama.cpp walks a hash map, so when several texts
// match, which one it takes is not specified; we prefer the order of its lists).
void detect_special_texts(TokenizerImpl& v) {
  detect_special(v, v.eot,
                 {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                  "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
                  // One literal in two: "\x9Cend" would read \x9Ce as one escape.
                  "<\xEF\xBD\x9C"  // NOLINT(bugprone-suspicious-missing-comma)
                  "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                  "<end_of_utterance>"});
  detect_special(v, v.eom, {"<|eom_id|>"});
  detect_special(v, v.fim_pre,
                 {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "\xE2\x96\x81<PRE>",
                  "<|code_prefix|>"});
  detect_special(v, v.fim_suf,
                 {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "\xE2\x96\x81<SUF>",
                  "<|code_suffix|>"});
  detect_special(v, v.fim_mid,
                 {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "\xE2\x96\x81<MID>",
                  "<|code_middle|>"});
  detect_special(v, v.fim_pad, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"});
  detect_special(v, v.fim_rep,
                 {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"});
  detect_special(v, v.fim_sep, {"<|file_sep|>"});

  // Control tokens whose text says "unused" are marked unused.
  for (size_t i = 0; i < v.texts.size(); ++i)
    if ((v.attrs[i] & kAttrControl) && v.texts[i].find("unused") != std::string_view::npos)
      v.attrs[i] |= kAttrUnused;
}

// The end-of-generation set (v.eog, sorted): FIM pad/repo/sep, the known end texts (forced to
// control), eos/eot/eom; gpt-oss's harmony markers become user-defined.
void collect_eog(TokenizerImpl& v) {
  std::set<TokenId> eog;
  for (TokenId id : {v.fim_pad, v.fim_rep, v.fim_sep})
    if (id >= 0) eog.insert(id);
  for (std::string_view name : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
                                "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
                                "_<EOT>", "<|end_of_text|>", "<end_of_utterance>"}) {
    const TokenId id = v.text_to_token(name);
    if (id >= 0) {
      eog.insert(id);
      force_control(v, id);
    }
  }
  for (std::string_view name : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
    const TokenId id = v.text_to_token(name);
    if (id >= 0) v.attrs[id] = kAttrUserDefined;
  }
  for (TokenId id : {v.eos, v.eot, v.eom})
    if (id >= 0) eog.insert(id);
  {  // gpt-oss: "<|end|>" is not end-of-generation when "<|return|>" and "<|call|>" exist
    const TokenId ret = v.text_to_token("<|return|>"), call = v.text_to_token("<|call|>");
    const TokenId end = v.text_to_token("<|end|>");
    if (ret >= 0 && call >= 0 && end >= 0 && eog.count(ret) && eog.count(call)) eog.erase(end);
  }
  v.eog.assign(eog.begin(), eog.end());
}

// Special-token cache, longest text first (std::sort like llama.cpp, so ties match g++).
void build_special_cache(TokenizerImpl& v) {
  for (size_t i = 0; i < v.texts.size(); ++i)
    if (v.attrs[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown))
      v.special_cache.push_back(static_cast<TokenId>(i));
  std::sort(v.special_cache.begin(), v.special_cache.end(),
            [&](TokenId a, TokenId b) { return v.texts[a].size() > v.texts[b].size(); });
}

// Per-model token attributes (llama.cpp sets these by general.name); needs special_cache.
void apply_model_attrs(TokenizerImpl& v, const GgufFile& f) {
  std::string name(f.get_string_opt("general.name").value_or(""));
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  auto set_attr = [&](std::string_view text, uint32_t a, bool on) {
    const TokenId id = v.text_to_token(text);
    if (id < 0) return;
    v.attrs[id] = on ? (v.attrs[id] | a) : (v.attrs[id] & ~a);
  };
  if (v.pre.find("jina-v2") != std::string::npos) {
    set_attr("<mask>", kAttrLstrip, true);
  } else if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (TokenId id : v.special_cache) v.attrs[id] |= kAttrRstrip;
    set_attr("</s>", kAttrRstrip, true);
    for (auto t : {"<unk>", "<s>", "<|endoftext|>"}) set_attr(t, kAttrRstrip, false);
  }
}

}  // namespace

Tokenizer::Tokenizer() : impl_(std::make_unique<TokenizerImpl>()) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  TokenizerImpl& v = *tok->impl_;
  const std::string where = " in " + f.path();

  load_model_kind(v, f, where);
  const size_t n = load_tokens(v, f, where);
  read_special_ids(v, f, n);
  detect_special_texts(v);
  collect_eog(v);
  build_special_cache(v);
  apply_model_attrs(v, f);
  v.build_special_matcher();
  return tok;
}

}  // namespace tandem
