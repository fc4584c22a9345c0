// A small HTTP/1.1 keep-alive client (Boost.Beast over Asio, OpenSSL for https) for the device's
// talk with the cloud. One HttpClient owns one connection and is used by one thread at a time;
// abort() may be called from any thread.
//
//   tandem::net::HttpClient http(tandem::net::parse_url("https://host:8443/prefix"), {.insecure =
//   true}); HttpResponse r = http.request("POST", "/tandem/v1/sessions", "{}",
//   std::chrono::seconds(5));
//
// request() throws NetError for anything below HTTP (connect refused, timeout, TLS failure, a
// truncated or unparsable answer); any HTTP status comes back as a response.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tandem::net {

// The longest pause a Retry-After header may impose on the device (seconds): a cloud that asks
// for more is only believed up to here, so no answer can turn the cloud off for good.
inline constexpr double kMaxRetryAfterS = 60;

// Seconds a Retry-After header value asks the client to wait, within [0, kMaxRetryAfterS]:
// delta-seconds ("120", also "1.5"), or an IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT")
// measured from `now_unix_s`. Anything else ("inf", "nan", "-5", "1e308", junk, "") is not a
// request to wait: 0, and the client's own backoff applies.
double parse_retry_after(std::string_view value, double now_unix_s);
// The same, measured from the system clock.
double parse_retry_after(std::string_view value);

struct Url {
  std::string scheme;  // "http" or "https"
  std::string host;    // without brackets for IPv6
  uint16_t port = 0;
  std::string prefix;  // path prefix without a trailing '/', "" for none
  bool tls() const { return scheme == "https"; }
  std::string origin() const;  // scheme://host:port
};

// Parses http://host[:port][/prefix] and https://...; throws std::invalid_argument naming the
// part that is wrong.
Url parse_url(std::string_view text);

struct HttpOptions {
  bool insecure = false;  // https: skip certificate and host name verification
  std::string ca_file;    // https: extra CA bundle (PEM), "" for the system's
  std::string api_key;    // sent as "Authorization: Bearer KEY" when not empty
  // An answer's body over this fails the request with NetError::Protocol naming the limit (a
  // hostile or broken server cannot make the device buffer without bound).
  size_t max_body_bytes = 64u << 20;
  std::string user_agent = "tandem-run/0.1";
};

struct HttpResponse {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

class NetError : public std::runtime_error {
 public:
  enum class Kind { Connect, Timeout, Io, Tls, Aborted, Protocol };
  NetError(Kind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

class HttpClient {
 public:
  HttpClient(Url base, HttpOptions options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Sends METHOD prefix+target with a JSON body (empty: none) and reads the whole answer, all
  // within `timeout` (connect included). Reuses the keep-alive connection; when a reused
  // connection turns out to be closed by the server before it answered, reconnects once.
  // `max_body_bytes` (0: HttpOptions::max_body_bytes; never more than it) caps this answer's
  // body: a Content-Length over it fails from the header, a chunked body as soon as it grows
  // past it (NetError::Protocol), so no more than the cap is ever buffered.
  HttpResponse request(std::string_view method, std::string_view target, std::string_view body,
                       std::chrono::milliseconds timeout, size_t max_body_bytes = 0);

  // Sends METHOD prefix+target as the connection's last request and closes it without reading
  // the answer: for a goodbye (a session's DELETE at exit) that nobody waits for. Only on a live
  // keep-alive connection (a new one would cost the round trip this saves); false when nothing
  // was sent. Never throws.
  bool send_last(std::string_view method, std::string_view target,
                 std::chrono::milliseconds timeout) noexcept;

  // Fails the request in flight (from any thread) and every later one with NetError::Aborted.
  void abort();
  // Closes the connection (next request reconnects).
  void disconnect();

  uint64_t bytes_sent() const { return bytes_sent_.load(); }
  uint64_t bytes_received() const { return bytes_received_.load(); }
  uint64_t connects() const { return connects_.load(); }
  const Url& url() const { return base_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Url base_;
  HttpOptions options_;
  std::atomic<uint64_t> bytes_sent_{0}, bytes_received_{0}, connects_{0};
  std::atomic<bool> aborted_{false};
};

}  // namespace tandem::net
