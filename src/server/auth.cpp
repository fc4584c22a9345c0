#include "server/auth.h"

#include <arpa/inet.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>
#include <sstream>

#include "common/error.h"

namespace tandem::server {
namespace {

constexpr size_t kMaxName = 64;
constexpr size_t kMaxKey = 512;
constexpr size_t kMaxLine = 4096;
constexpr size_t kMaxFileBytes = 16 << 20;

std::array<uint8_t, 32> digest_of(std::string_view key) {
  std::array<uint8_t, 32> d{};
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), d.data());
  return d;
}

bool visible_ascii(std::string_view s) {
  for (char c : s) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

bool valid_name(std::string_view s) {
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.' || c == '@';
    if (!ok) return false;
  }
  return !s.empty() && s.size() <= kMaxName;
}

// Splits a line at runs of spaces and tabs.
std::vector<std::string> fields_of(std::string_view line) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    const size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
    if (i > start) out.emplace_back(line.substr(start, i - start));
  }
  return out;
}

struct Line {
  size_t number;
  std::vector<std::string> fields;
};

// The lines that hold an entry (not blank, not a comment), each split into fields.
std::vector<Line> entry_lines(std::string_view text, const std::string& file) {
  std::vector<Line> out;
  size_t number = 0, pos = 0;
  while (pos < text.size()) {
    ++number;
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    const std::string where = file + ":" + std::to_string(number);
    if (line.size() > kMaxLine) {
      throw Error(where + ": the line is longer than " + std::to_string(kMaxLine) + " bytes");
    }
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::vector<std::string> fields = fields_of(line);
    if (fields.empty() || fields[0][0] == '#') continue;
    out.push_back({number, std::move(fields)});
  }
  return out;
}

}  // namespace

KeyRing KeyRing::parse(std::string_view text, const std::string& file) {
  const std::vector<Line> lines = entry_lines(text, file);
  if (lines.empty()) throw Error(file + ": holds no key (expected lines 'NAME KEY [admin]')");
  KeyRing ring;
  // The format before names: one bare key, the file's only line.
  if (lines.size() == 1 && lines[0].fields.size() == 1) {
    ring.add("default", lines[0].fields[0], false, file + ":" + std::to_string(lines[0].number));
    return ring;
  }
  for (const Line& l : lines) {
    const std::string where = file + ":" + std::to_string(l.number);
    const auto& f = l.fields;
    if (f.size() < 2 || f.size() > 3) {
      throw Error(where + ": expected 'NAME KEY' or 'NAME KEY admin', found " +
                  std::to_string(f.size()) + " field" + (f.size() == 1 ? "" : "s") +
                  (f.size() == 1 ? " (a bare key is allowed only as a file's single line)" : ""));
    }
    if (f.size() == 3 && f[2] != "admin") {
      throw Error(where + ": the third field must be 'admin', found '" + f[2].substr(0, 32) + "'");
    }
    ring.add(f[0], f[1], f.size() == 3, where);
  }
  return ring;
}

KeyRing KeyRing::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read key file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().size() > kMaxFileBytes) {
    throw Error("key file '" + path + "' is larger than " + std::to_string(kMaxFileBytes) +
                " bytes");
  }
  return parse(text.str(), path);
}

void KeyRing::add(const std::string& name, const std::string& key, bool admin,
                  const std::string& where) {
  if (!valid_name(name)) {
    throw Error(where + ": the name '" + name.substr(0, kMaxName) +
                "' must be 1 to 64 letters, digits, '-', '_', '.' or '@'");
  }
  if (key.empty()) throw Error(where + ": the key of '" + name + "' is empty");
  if (key.size() > kMaxKey || !visible_ascii(key)) {
    throw Error(where + ": the key of '" + name + "' must be 1 to " + std::to_string(kMaxKey) +
                " visible ASCII characters without spaces");
  }
  const Digest d = digest_of(key);
  check_unique(name, d, where);
  entries_.push_back({{name, admin}, d, where});
}

void KeyRing::check_unique(const std::string& name, const Digest& d,
                           const std::string& where) const {
  for (const Entry& e : entries_) {
    if (e.who.name == name) {
      throw Error(where + ": the name '" + name + "' is already used (" + e.where + ")");
    }
    if (CRYPTO_memcmp(e.digest.data(), d.data(), d.size()) == 0) {
      throw Error(where + ": the key of '" + name + "' is already the key of '" + e.who.name +
                  "' (" + e.where + ")");
    }
  }
}

void KeyRing::merge(const KeyRing& other) {
  for (const Entry& e : other.entries_) {
    check_unique(e.who.name, e.digest, e.where);
    entries_.push_back(e);
  }
}

const Credential* KeyRing::find(std::string_view key) const {
  const Digest d = digest_of(key);
  const Credential* found = nullptr;
  for (const Entry& e : entries_) {  // no early exit: every digest is compared
    if (CRYPTO_memcmp(e.digest.data(), d.data(), d.size()) == 0) found = &e.who;
  }
  return found;
}

bool KeyRing::has_admin() const {
  for (const Entry& e : entries_) {
    if (e.who.admin) return true;
  }
  return false;
}

size_t KeyRing::client_count() const {
  size_t n = 0;
  for (const Entry& e : entries_) n += e.who.admin ? 0 : 1;
  return n;
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  std::string bare = host;
  if (bare.size() > 2 && bare.front() == '[' && bare.back() == ']') {
    bare = bare.substr(1, bare.size() - 2);
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, bare.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

}  // namespace tandem::server
