// Credentials of `tandem serve`: who may call it, under which name, and who is an admin.
//
// A key file holds one client per line (docs/server.md, "Keys and sessions"):
//
//   # comment
//   phone-fleet  3f9c0a...e1          <- NAME KEY
//   ops          77ab12...90  admin   <- NAME KEY admin
//
// Names and keys are runs of visible ASCII without spaces; blank lines and lines starting with
// '#' are skipped. A file whose only line is one bare KEY (the format before names existed) is
// one client named "default". Every error names the file and line.
//
// Lookup hashes the presented key once (SHA-256) and compares it with every stored digest in
// full, so neither the time taken nor an early exit tells which key, or how much of one, matched.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::server {

struct Credential {
  std::string name;  // owns the sessions it creates; "" is the anonymous client of an open server
  bool admin = false;
};

class KeyRing {
 public:
  // Parses a key file's text; `file` names it in error messages (file:line: what).
  static KeyRing parse(std::string_view text, const std::string& file);
  // Reads and parses a key file.
  static KeyRing load(const std::string& path);

  // Adds one client; `where` names the source for errors ("--api-key", "keys.txt:3"). Throws on
  // an empty or malformed name or key and on a name or key already present.
  void add(const std::string& name, const std::string& key, bool admin, const std::string& where);
  // Adds every client of `other`, with the same checks.
  void merge(const KeyRing& other);

  // The client whose key this is, or nullptr.
  const Credential* find(std::string_view key) const;
  bool empty() const { return entries_.empty(); }
  bool has_admin() const;
  // Clients that are not admins (how many compete for sessions in the usual deployment).
  size_t client_count() const;

 private:
  using Digest = std::array<uint8_t, 32>;
  struct Entry {
    Credential who;
    Digest digest;
    std::string where;
  };
  // Throws when the name or the key (by digest) is already present.
  void check_unique(const std::string& name, const Digest& d, const std::string& where) const;
  std::vector<Entry> entries_;
};

// True when `host` (a --host value) accepts connections from this machine only.
bool is_loopback_host(const std::string& host);

}  // namespace tandem::server
