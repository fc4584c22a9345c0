#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <queue>
#include <set>

#include "common/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace tandem {

// ---------------------------------------------------------------------------------------------
// StrMap

namespace {
uint32_t hash_sv(std::string_view s) {
  // 64-bit FNV-1a folded to 32 bits: token texts are short, so this beats a block hash.
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return static_cast<uint32_t>(h ^ (h >> 32));
}
}  // namespace

void StrMap::build(const std::vector<std::string_view>* keys, size_t expected) {
  keys_ = keys;
  size_t cap = 16;
  while (cap < expected * 2) cap <<= 1;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  size_ = 0;
}

uint32_t StrMap::hash_of(int32_t index) const {
  return hash_sv((*keys_)[index]);
}

void StrMap::insert_hashed(int32_t index, uint32_t h, bool overwrite) {
  if ((size_ + 1) * 2 > slots_.size()) {
    std::vector<Slot> old = std::move(slots_);
    const size_t n = size_;
    build(keys_, std::max<size_t>(16, (n + 1) * 2));
    for (const auto& s : old) {
      if (s.value < 0) continue;
      size_t i = s.hash & mask_;
      while (slots_[i].value >= 0) i = (i + 1) & mask_;
      slots_[i] = s;
      ++size_;
    }
  }
  const std::string_view key = (*keys_)[index];
  size_t i = h & mask_;
  while (slots_[i].value >= 0) {
    if (slots_[i].hash == h && (*keys_)[slots_[i].value] == key) {
      if (overwrite) slots_[i].value = index;
      return;
    }
    i = (i + 1) & mask_;
  }
  slots_[i] = Slot{h, index};
  ++size_;
}

void StrMap::build_all(const std::vector<std::string_view>* keys, bool overwrite,
                       const std::vector<uint8_t>* skip) {
  const size_t n = keys->size();
  build(keys, n);
  std::vector<uint32_t> hashes(n);
  for (size_t i = 0; i < n; ++i) hashes[i] = hash_sv((*keys)[i]);
  constexpr size_t kAhead = 16;
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) __builtin_prefetch(&slots_[hashes[i + kAhead] & mask_]);
    if (skip && (*skip)[i]) continue;
    insert_hashed(static_cast<int32_t>(i), hashes[i], overwrite);
  }
}

int32_t StrMap::find(std::string_view key) const {
  if (slots_.empty()) return -1;
  const uint32_t h = hash_sv(key);
  size_t i = h & mask_;
  while (slots_[i].value >= 0) {
    if (slots_[i].hash == h && (*keys_)[slots_[i].value] == key) return slots_[i].value;
    i = (i + 1) & mask_;
  }
  return -1;
}

namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

void escape_whitespace(std::string& s) {
  std::string out;
  out.reserve(s.size() + 16);
  for (char c : s) {
    if (c == ' ')
      out += kSpace;
    else
      out += c;
  }
  s.swap(out);
}

void unescape_whitespace(std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, kSpace.size(), kSpace) == 0) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += s[i++];
    }
  }
  s.swap(out);
}

}  // namespace

namespace {

// ---------------------------------------------------------------------------------------------
// SPM (llama.cpp's llm_tokenizer_spm_session)

struct Symbol {
  int prev;
  int next;
  const char* text;
  size_t n;
};

struct SpmBigram {
  int left, right;
  float score;
  size_t size;
};
struct SpmCmp {
  bool operator()(const SpmBigram& l, const SpmBigram& r) const {
    return (l.score < r.score) || (l.score == r.score && l.left > r.left);
  }
};

struct BpeBigram {
  int left, right;
  int rank;
  size_t size;
};
struct BpeCmp {
  bool operator()(const BpeBigram& l, const BpeBigram& r) const {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  }
};

// Appends one symbol per UTF-8 character of s (a truncated last character keeps the bytes
// left), linked as a list: symbols[i].prev = i - 1, .next = i + 1 or -1 at the end. Expects
// `symbols` empty, since the links are indices from 0.
void append_char_symbols(std::string_view s, std::vector<Symbol>& symbols) {
  int index = 0;
  size_t offset = 0;
  while (offset < s.size()) {
    Symbol sym;
    sym.text = s.data() + offset;
    sym.n = std::min(unicode::len_utf8(s[offset]), s.size() - offset);
    offset += sym.n;
    sym.prev = index - 1;
    sym.next = offset == s.size() ? -1 : index + 1;
    index++;
    symbols.push_back(sym);
  }
}

// Merges symbol `right` (the next in the list) into `left`: right keeps n == 0 and is unlinked.
inline void merge_right_into_left(std::vector<Symbol>& symbols, int left, int right) {
  Symbol& l = symbols[left];
  Symbol& r = symbols[right];
  l.n += r.n;
  r.n = 0;
  l.next = r.next;
  if (r.next >= 0) symbols[r.next].prev = left;
}

}  // namespace

TokenId TokenizerImpl::byte_to_token(uint8_t b) const {
  static const char* hex = "0123456789ABCDEF";
  if (kind == Kind::SPM) {
    const char buf[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
    TokenId id = text_to_token(std::string_view(buf, 6));
    if (id >= 0) return id;
    id = text_to_token(std::string_view(reinterpret_cast<const char*>(&b), 1));
    if (id >= 0) return id;
  } else {
    TokenId id = text_to_token(unicode::byte_to_utf8(b));
    if (id >= 0) return id;
  }
  if (unk >= 0) return unk;
  char msg[96];
  std::snprintf(msg, sizeof msg, "tokenizer: vocabulary has no token for byte 0x%02X", b);
  throw Error(msg);
}

void TokenizerImpl::spm_tokenize(const std::string& text, std::vector<TokenId>& output) const {
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  append_char_symbols(text, symbols);

  // Lazy invalidation: a merge changes two symbols, and the bigrams that named them stay in the
  // queue until popped and found stale (their size no longer adds up). Each merge pushes at most
  // two bigrams, so one piece of n symbols costs O(n log n), however long it is.
  std::priority_queue<SpmBigram, std::vector<SpmBigram>, SpmCmp> work_queue;

  auto try_add_bigram = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const std::string_view s(symbols[left].text, symbols[left].n + symbols[right].n);
    if (s.size() > max_token_len) return;
    const TokenId token = text_to_token(s);
    if (token < 0 || static_cast<size_t>(token) >= texts.size()) return;
    work_queue.push(SpmBigram{left, right, scores.empty() ? 0.0f : scores[token], s.size()});
  };

  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add_bigram(i - 1, i);

  while (!work_queue.empty()) {
    const SpmBigram bigram = work_queue.top();
    work_queue.pop();
    auto& left_sym = symbols[bigram.left];
    auto& right_sym = symbols[bigram.right];
    if (left_sym.n == 0 || right_sym.n == 0 || left_sym.n + right_sym.n != bigram.size) continue;
    merge_right_into_left(symbols, bigram.left, bigram.right);
    try_add_bigram(left_sym.prev, bigram.left);
    try_add_bigram(bigram.left, left_sym.next);
  }

  // llama.cpp resegments a final symbol that is not a token through a map of the merges it made
  // (recursively). Here every merge makes a token (try_add_bigram queues only texts that are
  // tokens), so a final symbol that is not a token is one unmerged character, and a character is
  // never the text of a merge: a merge's left symbol alone is as long as its first byte says a
  // character is. So that map is never hit, and the bytes fall back directly.
  if (symbols.empty()) return;
  for (int i = 0; i != -1; i = symbols[i].next) {
    const Symbol& symbol = symbols[i];
    const TokenId token = text_to_token(std::string_view(symbol.text, symbol.n));
    if (token >= 0) {
      output.push_back(token);
      continue;
    }
    for (size_t j = 0; j < symbol.n; ++j)
      output.push_back(byte_to_token(static_cast<uint8_t>(symbol.text[j])));
  }
}

// ---------------------------------------------------------------------------------------------
// BPE (llama.cpp's llm_tokenizer_bpe_session)

int TokenizerImpl::bpe_rank(std::string_view left, std::string_view right,
                            std::string& scratch) const {
  scratch.assign(left);
  scratch += ' ';
  scratch += right;
  const int32_t i = merge_rank.find(scratch);
  if (i < 0) return -1;
  // The stored merge splits at its first space after position 0; it must split where we do.
  if (merges[i].find(' ', 1) != left.size()) return -1;
  return i;
}

namespace {

// One pre-tokenized word into its BPE symbols: split into UTF-8 characters (or kept whole when
// ignore_merges and the word is a token), then the lowest-rank adjacent pair merged until none
// is a merge. Merged-away symbols are left with n == 0. `symbols` and `scratch` are reused
// across words to keep their capacity.
void bpe_merge_word(const TokenizerImpl& v, const std::string& word, std::vector<Symbol>& symbols,
                    std::string& scratch) {
  std::priority_queue<BpeBigram, std::vector<BpeBigram>, BpeCmp> work_queue;
  symbols.clear();
  if (v.ignore_merges && v.text_to_token(word) >= 0) {
    symbols.push_back(Symbol{-1, -1, word.data(), word.size()});
  } else {
    append_char_symbols(word, symbols);
  }

  auto add_new_bigram = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const std::string_view lt(symbols[left].text, symbols[left].n);
    const std::string_view rt(symbols[right].text, symbols[right].n);
    const int rank = v.bpe_rank(lt, rt, scratch);
    if (rank < 0) return;
    work_queue.push(BpeBigram{left, right, rank, lt.size() + rt.size()});
  };

  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) add_new_bigram(i - 1, i);

  while (!work_queue.empty()) {
    const BpeBigram bigram = work_queue.top();
    work_queue.pop();
    auto& left_symbol = symbols[bigram.left];
    auto& right_symbol = symbols[bigram.right];
    if (left_symbol.n == 0 || right_symbol.n == 0) continue;
    // llama.cpp compares left+right with the bigram's text. Both symbols are alive, so right
    // still directly follows left in the word and the texts are equal iff the sizes are.
    if (left_symbol.n + right_symbol.n != bigram.size) continue;  // outdated
    merge_right_into_left(symbols, bigram.left, bigram.right);
    add_new_bigram(left_symbol.prev, bigram.left);
    add_new_bigram(bigram.left, left_symbol.next);
  }
}

}  // namespace

void TokenizerImpl::bpe_tokenize(std::string_view text, std::vector<TokenId>& output) const {
  const std::vector<std::string> words = pretok->split(text);
  std::vector<Symbol> symbols_final;
  std::vector<Symbol> symbols;
  std::string scratch;
  int final_prev_index = -1;

  for (const auto& word : words) {
    bpe_merge_word(*this, word, symbols, scratch);
    for (auto& sym : symbols) {
      if (sym.n > 0) {
        sym.prev = final_prev_index;
        sym.next = -1;
        if (final_prev_index != -1)
          symbols_final[final_prev_index].next = static_cast<int>(symbols_final.size());
        symbols_final.push_back(sym);
        final_prev_index = static_cast<int>(symbols_final.size()) - 1;
      }
    }
  }

  if (symbols_final.empty()) return;
  for (int i = 0; i != -1; i = symbols_final[i].next) {
    const auto& symbol = symbols_final[i];
    if (symbol.n == 0) continue;
    const std::string_view str(symbol.text, symbol.n);
    const TokenId token = text_to_token(str);
    if (token < 0) {
      for (char c : str) {
        const TokenId t = text_to_token(std::string_view(&c, 1));
        if (t >= 0) output.push_back(t);
      }
    } else {
      output.push_back(token);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Pieces

std::string TokenizerImpl::piece(TokenId id, bool special, int lstrip) const {
  if (id < 0 || static_cast<size_t>(id) >= texts.size()) return {};
  const uint32_t attr = attrs[id];
  constexpr uint32_t kSpecial = kAttrUnknown | kAttrControl;
  if (!special && (attr & kSpecial)) return {};
  std::string r;
  const std::string_view text = texts[id];
  if (attr & (kSpecial | kAttrUserDefined)) {
    r.assign(text);
  } else if (attr & kAttrNormal) {
    if (kind == Kind::SPM) {
      r.assign(text);
      unescape_whitespace(r);
    } else {
      const std::vector<uint32_t> cpts = unicode::cpts_from_utf8(text);
      std::string utf8;
      for (uint32_t c : cpts) {
        const int b = unicode::utf8_cpt_to_byte(c);
        if (b >= 0) {
          r += static_cast<char>(b);
        } else {
          utf8.clear();
          unicode::append_utf8(utf8, c);
          r += "[UNK_BYTE_0x";
          char hx[3];
          for (char ch : utf8) {
            std::snprintf(hx, sizeof hx, "%02x", static_cast<uint8_t>(ch));
            r += hx;
          }
          r.append(text);
          r += "]";
        }
      }
    }
  } else if ((attr & kAttrByte) && kind == Kind::SPM) {
    // strtol(text + 3, nullptr, 16) on "<0xXX>"
    unsigned v = 0;
    for (size_t i = 3; i < text.size(); ++i) {
      const char c = text[i];
      int d;
      if (c >= '0' && c <= '9')
        d = c - '0';
      else if (c >= 'a' && c <= 'f')
        d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        d = c - 'A' + 10;
      else
        break;
      v = v * 16 + d;
    }
    r.push_back(static_cast<char>(v));
  }
  size_t skip = 0;
  while (static_cast<int>(skip) < lstrip && skip < r.size() && r[skip] == ' ') ++skip;
  if (skip) r.erase(0, skip);
  return r;
}

// ---------------------------------------------------------------------------------------------
// Encoding

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  const TokenizerImpl& v = *impl_;
  const std::vector<Fragment> frags = v.partition_special(text, parse_special);

  std::vector<TokenId> out;
  if (v.kind == TokenizerImpl::Kind::SPM) {
    bool is_prev_special = true;  // prefix with space if first token
    if (add_special && v.add_bos && v.bos >= 0) out.push_back(v.bos);
    std::string s;
    for (const Fragment& fr : frags) {
      if (!fr.is_token) {
        s.clear();
        if (v.add_space_prefix && is_prev_special) s = ' ';
        s.append(text.substr(fr.off, fr.len));
        escape_whitespace(s);
        v.spm_tokenize(s, out);
        is_prev_special = false;
      } else {
        out.push_back(fr.id);
        is_prev_special = true;
      }
    }
    if (add_special && v.add_eos && v.eos >= 0) out.push_back(v.eos);
  } else {
    if (add_special && v.add_bos && v.bos >= 0) out.push_back(v.bos);
    for (const Fragment& fr : frags) {
      if (!fr.is_token)
        v.bpe_tokenize(text.substr(fr.off, fr.len), out);
      else
        out.push_back(fr.id);
    }
    if (add_special && v.add_eos && v.eos >= 0) out.push_back(v.eos);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Decoding

std::string Tokenizer::token_to_piece(TokenId id, bool special) const {
  return impl_->piece(id, special, 0);
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool remove_special,
                              bool unparse_special) const {
  const TokenizerImpl& v = *impl_;
  bool remove_space = v.add_space_prefix;
  if (remove_special && v.add_bos && !ids.empty() && ids.front() == v.bos) {
    remove_space = false;
    ids = ids.subspan(1);
  }
  if (remove_special && v.add_eos && !ids.empty() && ids.back() == v.eos)
    ids = ids.first(ids.size() - 1);

  std::string text;
  for (TokenId id : ids) {
    text += v.piece(id, unparse_special, remove_space ? 1 : 0);
    remove_space = false;
  }
  if (!v.clean_spaces || text.empty()) return text;

  // llama.cpp's clean_up_tokenization_spaces, three in-place passes.
  {  // " ?", " !", " .", " ,"
    const size_t total1 = text.size();
    size_t total = 1;
    for (size_t i = 1; i < total1; ++i) {
      const char x = text[i];
      if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ','))
        --total;  // remove space
      text[total++] = x;
    }
    text.resize(total);
  }
  if (!text.empty()) {  // " ' " -> "'"
    const size_t total2 = text.size();
    size_t total = 1;
    for (size_t i = 1; i < total2; ++i) {
      const char x = text[i];
      if (x == '\'' && i + 1 < total2 && text[i - 1] == ' ' && text[i + 1] == ' ') {
        --total;           // remove prev space
        text[++i] = '\0';  // remove next space
      }
      text[total++] = x;
    }
    text.resize(total);
  }
  if (!text.empty()) {  // " 's", " 'm", " 're", " 've"
    const size_t total3 = text.size();
    size_t total = 1;
    for (size_t i = 1; i < total3; ++i) {
      const char x = text[i];
      if (text[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
        const char x1 = text[i + 1];
        if (x1 == 't' || x1 == 'd') {
          // keep
        } else if (x1 == 's' || x1 == 'm') {
          --total;
        } else if (i + 2 < total3) {
          const char x2 = text[i + 2];
          if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
        }
      }
      text[total++] = x;
    }
    text.resize(total);
  }
  return text;
}

// ---------------------------------------------------------------------------------------------
// Accessors

int32_t Tokenizer::n_vocab() const {
  return static_cast<int32_t>(impl_->texts.size());
}
TokenId Tokenizer::bos() const {
  return impl_->bos;
}
TokenId Tokenizer::eos() const {
  return impl_->eos;
}
TokenId Tokenizer::eot() const {
  return impl_->eot;
}
TokenId Tokenizer::unk() const {
  return impl_->unk;
}
TokenId Tokenizer::pad() const {
  return impl_->pad;
}
bool Tokenizer::add_bos() const {
  return impl_->add_bos;
}
bool Tokenizer::add_eos() const {
  return impl_->add_eos;
}
bool Tokenizer::add_space_prefix() const {
  return impl_->add_space_prefix;
}
bool Tokenizer::clean_spaces() const {
  return impl_->clean_spaces;
}
bool Tokenizer::is_eog(TokenId id) const {
  return id >= 0 && std::binary_search(impl_->eog.begin(), impl_->eog.end(), id);
}
const std::vector<TokenId>& Tokenizer::eog_ids() const {
  return impl_->eog;
}
std::string_view Tokenizer::model_name() const {
  return impl_->model;
}
std::string_view Tokenizer::pre_name() const {
  return impl_->pre;
}

std::string_view Tokenizer::token_text(TokenId id) const {
  if (id < 0 || id >= n_vocab()) return {};
  return impl_->texts[id];
}

TokenAttr Tokenizer::attr(TokenId id) const {
  if (id < 0 || id >= n_vocab()) return TokenAttr::UNDEFINED;
  const uint32_t a = impl_->attrs[id];
  if (a & kAttrUnknown) return TokenAttr::UNKNOWN;
  if (a & kAttrControl) return TokenAttr::CONTROL;
  if (a & kAttrUserDefined) return TokenAttr::USER_DEFINED;
  if (a & kAttrByte) return TokenAttr::BYTE;
  if (a & kAttrNormal) return TokenAttr::NORMAL;
  if (a & kAttrUnused) return TokenAttr::UNUSED;
  return TokenAttr::UNDEFINED;
}

TokenId Tokenizer::find_token(std::string_view text) const {
  return impl_->text_to_token(text);
}

std::string fingerprint_hex(uint64_t fingerprint) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fingerprint));
  return buf;
}

std::string Tokenizer::fingerprint_hex() const {
  return tandem::fingerprint_hex(fingerprint());
}

uint64_t Tokenizer::fingerprint() const {
  const TokenizerImpl& v = *impl_;
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](const void* data, size_t len) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < len; ++i) {
      h ^= p[i];
      h *= 0x100000001b3ull;
    }
  };
  auto mix_u32 = [&](uint32_t x) {
    uint8_t b[4] = {uint8_t(x), uint8_t(x >> 8), uint8_t(x >> 16), uint8_t(x >> 24)};
    mix(b, 4);
  };
  mix(v.model.data(), v.model.size());
  mix_u32(static_cast<uint32_t>(v.texts.size()));
  for (size_t i = 0; i < v.texts.size(); ++i) {
    mix_u32(static_cast<uint32_t>(v.texts[i].size()));
    mix(v.texts[i].data(), v.texts[i].size());
    mix(&v.types[i], 1);
  }
  for (TokenId id : {v.bos, v.eos, v.eot, v.unk, v.pad}) mix_u32(static_cast<uint32_t>(id));
  return h;
}

// ---------------------------------------------------------------------------------------------
// Streaming

size_t utf8_sanitize_append(std::string_view in, std::string& out, bool final) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  size_t i = 0;
  const size_t n = in.size();
  while (i < n) {
    const uint8_t c = static_cast<uint8_t>(in[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (RFC 3629)
    if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      out += kReplacement;
      ++i;
      continue;
    }
    size_t k = 1;
    bool bad = false;
    for (; k <= need && i + k < n; ++k) {
      const uint8_t d = static_cast<uint8_t>(in[i + k]);
      const bool ok = (k == 1) ? (d >= lo && d <= hi) : (d >= 0x80 && d <= 0xBF);
      if (!ok) {
        bad = true;
        break;
      }
    }
    if (bad) {  // maximal invalid subpart -> one U+FFFD
      out += kReplacement;
      i += k;
      continue;
    }
    if (k <= need) {  // ran out of input: incomplete but valid so far
      if (!final) return n - i;
      out += kReplacement;
      return 0;
    }
    out.append(in.substr(i, need + 1));
    i += need + 1;
  }
  return 0;
}

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool special) : tok_(tok), special_(special) {}

std::string StreamDecoder::push(TokenId id) {
  pending_ += tok_.token_to_piece(id, special_);
  std::string out;
  const size_t held = utf8_sanitize_append(pending_, out, false);
  pending_.erase(0, pending_.size() - held);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  utf8_sanitize_append(pending_, out, true);
  pending_.clear();
  return out;
}

}  // namespace tandem
