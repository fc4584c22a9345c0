// HTTP/1.1 keep-alive client over Boost.Beast. Every operation is asynchronous on a private
// io_context that request() runs to completion, so the per-request deadline (tcp_stream's
// expiry, a timer for name resolution) bounds connect, TLS handshake, write and read alike.
#include "net/http_client.h"

#include <openssl/ssl.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>

namespace tandem::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// ---- URL ----

std::string Url::origin() const {
  const bool v6 = host.find(':') != std::string::npos;
  return scheme + "://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Url parse_url(std::string_view text) {
  Url u;
  const size_t sep = text.find("://");
  if (sep == std::string_view::npos) {
    throw std::invalid_argument(
        "URL '" + std::string(text) +
        "' has no scheme: expected http://HOST[:PORT][/PREFIX] or https://...");
  }
  u.scheme = std::string(text.substr(0, sep));
  std::transform(u.scheme.begin(), u.scheme.end(), u.scheme.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (u.scheme != "http" && u.scheme != "https") {
    throw std::invalid_argument("URL '" + std::string(text) + "': scheme '" + u.scheme +
                                "' is not http or https");
  }
  std::string_view rest = text.substr(sep + 3);
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? "" : rest.substr(slash);
  if (authority.find('@') != std::string_view::npos) {
    throw std::invalid_argument("URL '" + std::string(text) +
                                "': user info is not supported (use --api-key)");
  }
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {  // [IPv6]:port
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      throw std::invalid_argument("URL '" + std::string(text) + "': unterminated '[' in the host");
    }
    u.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') {
        throw std::invalid_argument("URL '" + std::string(text) + "': junk after the IPv6 host");
      }
      port_text = after.substr(1);
    }
  } else {
    const size_t colon = authority.rfind(':');
    u.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port_text = authority.substr(colon + 1);
  }
  if (u.host.empty()) throw std::invalid_argument("URL '" + std::string(text) + "' has no host");
  if (port_text.empty()) {
    u.port = u.tls() ? 443 : 80;
  } else {
    unsigned port = 0;
    auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc() || end != port_text.data() + port_text.size() || port == 0 ||
        port > 65535) {
      throw std::invalid_argument("URL '" + std::string(text) + "': port '" +
                                  std::string(port_text) + "' is not a number in 1..65535");
    }
    u.port = static_cast<uint16_t>(port);
  }
  if (path.find_first_of("?#") != std::string_view::npos) {
    throw std::invalid_argument("URL '" + std::string(text) +
                                "': a query or fragment is not allowed in the base URL");
  }
  u.prefix = std::string(path);
  while (!u.prefix.empty() && u.prefix.back() == '/') u.prefix.pop_back();
  return u;
}

// ---- Retry-After ----

namespace {

bool all_digits(std::string_view s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
}

// "120" or "1.5": a plain decimal, no sign, no exponent; nullopt otherwise.
std::optional<double> delta_seconds(std::string_view s) {
  const size_t dot = s.find('.');
  const std::string_view whole = s.substr(0, dot);
  if (!all_digits(whole)) return std::nullopt;
  if (dot != std::string_view::npos && !all_digits(s.substr(dot + 1))) return std::nullopt;
  // More than six digits is more than the cap anyway (and keeps the number exact).
  if (whole.size() > 6) return kMaxRetryAfterS;
  const std::string text(s.substr(0, std::min<size_t>(s.size(), 24)));
  return std::strtod(text.c_str(), nullptr);
}

int number_at(std::string_view s, size_t pos, size_t len) {
  const std::string_view part = s.substr(pos, len);
  if (part.size() != len || !all_digits(part)) return -1;
  int v = 0;
  for (char c : part) v = v * 10 + (c - '0');
  return v;
}

// An IMF-fixdate, "Sun, 06 Nov 1994 08:49:37 GMT" (exactly 29 characters), as Unix seconds.
std::optional<double> imf_fixdate(std::string_view s) {
  static constexpr const char* kMonths = "JanFebMarAprMayJunJulAugSepOctNovDec";
  if (s.size() != 29 || s.substr(3, 2) != ", " || s[7] != ' ' || s[11] != ' ' || s[16] != ' ' ||
      s[19] != ':' || s[22] != ':' || s.substr(25) != " GMT") {
    return std::nullopt;
  }
  const char* month = std::strstr(kMonths, std::string(s.substr(8, 3)).c_str());
  const int day = number_at(s, 5, 2), year = number_at(s, 12, 4);
  const int hour = number_at(s, 17, 2), minute = number_at(s, 20, 2), second = number_at(s, 23, 2);
  if (!month || (month - kMonths) % 3 != 0 || day < 1 || day > 31 || year < 0 || hour < 0 ||
      hour > 23 || minute < 0 || minute > 59 || second < 0 || second > 60) {
    return std::nullopt;
  }
  std::tm tm{};
  tm.tm_year = year - 1900;
  tm.tm_mon = static_cast<int>((month - kMonths) / 3);
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = minute;
  tm.tm_sec = second;
  const std::time_t t = timegm(&tm);  // UTC, unlike mktime
  if (t == static_cast<std::time_t>(-1)) return std::nullopt;
  return static_cast<double>(t);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

double parse_retry_after(std::string_view value, double now_unix_s) {
  value = trim(value);
  double wait = 0;
  if (const auto delta = delta_seconds(value)) {
    wait = *delta;
  } else if (const auto date = imf_fixdate(value)) {
    wait = *date - now_unix_s;
  }
  // NaN fails both comparisons and becomes 0 as well.
  return wait > 0 ? std::min(wait, kMaxRetryAfterS) : 0.0;
}

double parse_retry_after(std::string_view value) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return parse_retry_after(value, std::chrono::duration<double>(now).count());
}

// ---- client ----

struct HttpClient::Impl {
  asio::io_context ioc;
  ssl::context ssl_ctx{ssl::context::tls_client};
  tcp::resolver resolver{ioc};
  std::unique_ptr<beast::tcp_stream> plain;
  std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> tls;
  beast::flat_buffer buffer;

  bool connected() const { return plain || tls; }
  beast::tcp_stream& lowest() { return tls ? beast::get_lowest_layer(*tls) : *plain; }

  // Runs the io_context until every pending handler has run.
  void run() {
    ioc.restart();
    ioc.run();
  }

  void close_socket() {
    beast::error_code ignored;
    if (plain) plain->socket().close(ignored);
    if (tls) beast::get_lowest_layer(*tls).socket().close(ignored);
    resolver.cancel();
  }

  void close() {
    close_socket();
    plain.reset();
    tls.reset();
    buffer.consume(buffer.size());
  }

  template <typename Fn>
  void with_stream(Fn&& fn) {
    if (tls) {
      fn(*tls);
    } else {
      fn(*plain);
    }
  }

  // The steps of one request attempt, each bounded by the request's deadline. A step that fails
  // returns the NetError kind and message request() fails with (it closes and throws).
  struct StepError {
    NetError::Kind kind;
    std::string what;
  };
  std::optional<StepError> connect(const Url& base, const HttpOptions& options,
                                   Clock::time_point deadline, std::atomic<uint64_t>& connects);
  size_t write(http::request<http::string_body>& req, Clock::time_point deadline,
               beast::error_code& ec);
  size_t read(http::response_parser<http::string_body>& parser, beast::error_code& ec);
};

namespace {

NetError::Kind kind_of(const beast::error_code& ec) {
  if (ec == beast::error::timeout || ec == asio::error::timed_out) return NetError::Kind::Timeout;
  return NetError::Kind::Io;
}

// A keep-alive connection the server closed while idle fails the next request this way.
bool is_stale_connection_error(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
         ec == ssl::error::stream_truncated;
}

}  // namespace

HttpClient::HttpClient(Url base, HttpOptions options)
    : impl_(std::make_unique<Impl>()), base_(std::move(base)), options_(std::move(options)) {
  if (base_.tls()) {
    if (options_.insecure) {
      impl_->ssl_ctx.set_verify_mode(ssl::verify_none);
    } else {
      impl_->ssl_ctx.set_default_verify_paths();
      if (!options_.ca_file.empty()) impl_->ssl_ctx.load_verify_file(options_.ca_file);
      impl_->ssl_ctx.set_verify_mode(ssl::verify_peer);
    }
  }
}

HttpClient::~HttpClient() {
  impl_->close();
}

void HttpClient::abort() {
  aborted_ = true;
  // Only close the socket here: pending operations still refer to the stream objects, which
  // request() releases once its run() has returned.
  asio::post(impl_->ioc, [impl = impl_.get()] { impl->close_socket(); });
}

void HttpClient::disconnect() {
  impl_->close();
}

namespace {

// The request as sent: HTTP/1.1, keep-alive, JSON in and out, the bearer key when one is set.
http::request<http::string_body> make_request(http::verb verb, const Url& base,
                                              const HttpOptions& options, std::string_view target,
                                              std::string_view body) {
  http::request<http::string_body> req{verb, base.prefix + std::string(target), 11};
  req.set(http::field::host, base.host + ":" + std::to_string(base.port));
  req.set(http::field::user_agent, options.user_agent);
  req.set(http::field::accept, "application/json");
  if (!options.api_key.empty()) req.set(http::field::authorization, "Bearer " + options.api_key);
  if (!body.empty()) {
    req.set(http::field::content_type, "application/json");
    req.body() = std::string(body);
  }
  req.keep_alive(true);
  req.prepare_payload();
  return req;
}

// Status, headers (names lower-cased) and body of a parsed answer.
HttpResponse take_response(http::response<http::string_body>& res) {
  HttpResponse out;
  out.status = static_cast<int>(res.result_int());
  for (const auto& field : res) {
    std::string name(field.name_string());
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    out.headers[name] = std::string(field.value());
  }
  out.body = std::move(res.body());
  return out;
}

}  // namespace

// Resolve (bounded by a timer: the resolver has no expiry of its own), open the TCP (or TLS)
// stream, connect, then the TLS handshake. connects counts successful TCP connects.
std::optional<HttpClient::Impl::StepError> HttpClient::Impl::connect(
    const Url& base, const HttpOptions& options, Clock::time_point deadline,
    std::atomic<uint64_t>& connects) {
  beast::error_code ec;
  tcp::resolver::results_type endpoints;
  asio::steady_timer timer(ioc);
  timer.expires_at(deadline);
  bool resolved = false;
  resolver.async_resolve(base.host, std::to_string(base.port),
                         [&](const beast::error_code& e, tcp::resolver::results_type r) {
                           ec = e;
                           endpoints = std::move(r);
                           resolved = true;
                           timer.cancel();
                         });
  timer.async_wait([&](const beast::error_code& e) {
    if (!e && !resolved) resolver.cancel();
  });
  run();
  if (ec) {
    return StepError{resolved && ec != asio::error::operation_aborted ? NetError::Kind::Connect
                                                                      : NetError::Kind::Timeout,
                     "cannot resolve host '" + base.host + "': " + ec.message()};
  }
  if (base.tls()) {
    tls = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(ioc, ssl_ctx);
    if (!SSL_set_tlsext_host_name(tls->native_handle(), base.host.c_str())) {
      return StepError{NetError::Kind::Tls, "cannot set the TLS server name"};
    }
    if (!options.insecure) tls->set_verify_callback(ssl::host_name_verification(base.host));
  } else {
    plain = std::make_unique<beast::tcp_stream>(ioc);
  }
  lowest().expires_at(deadline);
  lowest().async_connect(endpoints,
                         [&](const beast::error_code& e, const tcp::endpoint&) { ec = e; });
  run();
  if (ec) {
    const auto kind =
        kind_of(ec) == NetError::Kind::Timeout ? NetError::Kind::Timeout : NetError::Kind::Connect;
    return StepError{kind, "cannot connect: " + ec.message()};
  }
  ++connects;
  if (tls) {
    tls->async_handshake(ssl::stream_base::client, [&](const beast::error_code& e) { ec = e; });
    run();
    if (ec) {
      return StepError{
          kind_of(ec) == NetError::Kind::Timeout ? NetError::Kind::Timeout : NetError::Kind::Tls,
          "TLS handshake failed: " + ec.message()};
    }
  }
  return std::nullopt;
}

// Sends the whole request; returns the bytes written (also when it fails part way).
size_t HttpClient::Impl::write(http::request<http::string_body>& req, Clock::time_point deadline,
                               beast::error_code& ec) {
  lowest().expires_at(deadline);
  size_t written = 0;
  with_stream([&](auto& stream) {
    http::async_write(stream, req, [&](const beast::error_code& e, size_t n) {
      ec = e;
      written = n;
    });
  });
  run();
  return written;
}

// Reads the answer into parser; returns the bytes read (also when it fails part way). The
// header first, on its own: Beast 1.74's async_read parses eagerly and then loses the header's
// body_limit error, so a Content-Length over the limit would be reserved and read in full.
// Read alone, such a header fails with body_limit before any body.
size_t HttpClient::Impl::read(http::response_parser<http::string_body>& parser,
                              beast::error_code& ec) {
  size_t total = 0;
  for (const bool header_only : {true, false}) {
    if (!header_only && parser.is_done()) break;
    size_t n_read = 0;
    with_stream([&](auto& stream) {
      auto done = [&](const beast::error_code& e, size_t n) {
        ec = e;
        n_read = n;
      };
      if (header_only) {
        http::async_read_header(stream, buffer, parser, done);
      } else {
        http::async_read(stream, buffer, parser, done);
      }
    });
    run();
    total += n_read;
    if (ec) break;
  }
  return total;
}

// One attempt per loop turn: connect unless a kept-alive connection is open, write, read. A
// reused connection that fails before any answer byte (the server closed it while idle) is
// retried once on a fresh one; every other failure throws NetError (fail closes the connection).
HttpResponse HttpClient::request(std::string_view method, std::string_view target,
                                 std::string_view body, std::chrono::milliseconds timeout,
                                 size_t max_body_bytes) {
  const size_t body_cap = max_body_bytes == 0 ? options_.max_body_bytes
                                              : std::min(max_body_bytes, options_.max_body_bytes);
  const http::verb verb = http::string_to_verb(beast::string_view(method.data(), method.size()));
  if (verb == http::verb::unknown) {
    throw std::invalid_argument("HTTP method '" + std::string(method) + "' is unknown");
  }
  const Clock::time_point deadline = Clock::now() + timeout;
  const std::string where =
      std::string(method) + " " + base_.origin() + base_.prefix + std::string(target);
  auto fail = [&](NetError::Kind kind, const std::string& what) -> NetError {
    impl_->close();
    if (aborted_) return NetError(NetError::Kind::Aborted, where + ": aborted");
    if (kind == NetError::Kind::Timeout) {
      return NetError(kind, where + ": no complete answer within " +
                                std::to_string(timeout.count()) + " ms (" + what + ")");
    }
    return NetError(kind, where + ": " + what);
  };
  http::request<http::string_body> req = make_request(verb, base_, options_, target, body);

  for (int attempt = 0;; ++attempt) {
    if (aborted_) throw NetError(NetError::Kind::Aborted, where + ": aborted");
    const bool reused = impl_->connected();
    if (!reused) {
      if (auto e = impl_->connect(base_, options_, deadline, connects_))
        throw fail(e->kind, e->what);
    }

    beast::error_code ec;
    bytes_sent_ += impl_->write(req, deadline, ec);
    if (ec) {
      if (reused && attempt == 0 && kind_of(ec) != NetError::Kind::Timeout && !aborted_) {
        impl_->close();
        continue;
      }
      throw fail(kind_of(ec), "sending the request failed: " + ec.message());
    }

    http::response_parser<http::string_body> parser;
    parser.body_limit(body_cap);
    const size_t read = impl_->read(parser, ec);
    bytes_received_ += read;
    if (ec) {
      if (reused && attempt == 0 && read == 0 && is_stale_connection_error(ec) && !aborted_) {
        impl_->close();
        continue;
      }
      if (ec == http::error::body_limit) {
        throw fail(NetError::Kind::Protocol,
                   "the answer's body is over " + std::to_string(body_cap) + " bytes");
      }
      const bool truncated = ec == http::error::partial_message || read > 0;
      throw fail(kind_of(ec), std::string(truncated ? "the answer was cut short: "
                                                    : "reading the answer failed: ") +
                                  ec.message());
    }
    auto& res = parser.get();
    HttpResponse out = take_response(res);
    if (!res.keep_alive()) impl_->close();
    return out;
  }
}

bool HttpClient::send_last(std::string_view method, std::string_view target,
                           std::chrono::milliseconds timeout) noexcept {
  try {
    const http::verb verb = http::string_to_verb(beast::string_view(method.data(), method.size()));
    if (verb == http::verb::unknown || aborted_ || !impl_->connected()) return false;
    http::request<http::string_body> req = make_request(verb, base_, options_, target, "");
    req.keep_alive(false);
    beast::error_code ec;
    bytes_sent_ += impl_->write(req, Clock::now() + timeout, ec);
    impl_->close();
    return !ec;
  } catch (...) {
    impl_->close();
    return false;
  }
}

}  // namespace tandem::net
