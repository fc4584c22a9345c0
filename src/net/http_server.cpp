#include "tandem/http_server.h"

// <utility> first: Boost 1.74's asio/awaitable.hpp uses std::exchange without including it.
#include <optional>
#include <utility>

#include <poll.h>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "net/connection_ledger.h"
#include "tandem/error.h"

namespace tandem::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

const char* status_reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 409:
      return "Conflict";
    case 410:
      return "Gone";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

void send_json_text(Responder& responder, int status, std::string json_text,
                    const HeaderList& headers) {
  responder.send(status, "application/json", std::move(json_text), headers);
}

namespace {

std::string head(int status, const std::string& content_type, const HeaderList& headers,
                 bool keep_alive, const std::string* length_or_null) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " + status_reason(status) + "\r\n";
  h += "Server: tandem\r\nContent-Type: " + content_type + "\r\n";
  for (const auto& [k, v] : headers) h += k + ": " + v + "\r\n";
  if (length_or_null) {
    h += "Content-Length: " + *length_or_null + "\r\n";
  } else {
    h += "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n";
  }
  h += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return h;
}

std::string chunk(const std::string& data) {
  char size[20];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  return size + data + "\r\n";
}

// Open connections per client address, for --max-connections-per-ip. IPv6 clients count per /64:
// one host usually holds a whole /64 and could otherwise open a connection from each address.
class AddressTable {
 public:
  explicit AddressTable(int cap) : cap_(cap) {}

  static std::string key_of(const tcp::endpoint& ep) {
    asio::ip::address a = ep.address();
    if (a.is_v6() && a.to_v6().is_v4_mapped())
      a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
    if (a.is_v4()) return a.to_string();
    auto bytes = a.to_v6().to_bytes();
    std::fill(bytes.begin() + 8, bytes.end(), 0);
    return asio::ip::address_v6(bytes).to_string() + "/64";
  }
  bool try_acquire(const std::string& key) {
    if (cap_ <= 0) return true;
    std::lock_guard lk(mu_);
    int& n = counts_[key];
    if (n >= cap_) return false;
    ++n;
    return true;
  }
  // Past the cap: the newcomer takes the place of an idle connection being closed.
  void force_acquire(const std::string& key) {
    if (cap_ <= 0) return;
    std::lock_guard lk(mu_);
    ++counts_[key];
  }
  void release(const std::string& key) {
    if (cap_ <= 0) return;
    std::lock_guard lk(mu_);
    auto it = counts_.find(key);
    if (it != counts_.end() && --it->second <= 0) counts_.erase(it);
  }

 private:
  const int cap_;
  std::mutex mu_;
  std::unordered_map<std::string, int> counts_;
};

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

// What every connection of one server shares. Connections hold it by shared_ptr, so it outlives
// the HttpServer when a connection's last handler runs late.
struct Shared {
  Shared(const HttpServerOptions& o, HttpHandler h, ConnectionCounters* m)
      : options(o),
        handler(std::move(h)),
        counters(m),
        addresses(o.max_connections_per_ip),
        ledger({o.max_write_queue_bytes, o.max_write_total_bytes, o.small_answer_bytes,
                seconds(o.slow_reader_grace_s)},
               m) {}
  void count(std::atomic<uint64_t> ConnectionCounters::*counter) {
    if (counters) ++(counters->*counter);
  }

  const HttpServerOptions options;
  const HttpHandler handler;
  ConnectionCounters* const counters;
  AddressTable addresses;
  ConnectionLedger ledger;
  std::unique_ptr<asio::ssl::context> tls;  // set by start() before the first connection
  std::atomic<int64_t> open{0};             // connections
  std::atomic<int64_t> busy{0};             // connections with a request being answered
  std::atomic<bool> closing{false};         // shutdown: no more keep-alive
};

// What the peer of a socket did, seen without reading: nothing, sent bytes, or hung up (shut
// down its side, reset). POLLRDHUP reports a hang-up even behind unread bytes.
enum class Peer { Quiet, Sent, Gone };

Peer peer_state(int fd) {
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (::poll(&p, 1, 0) <= 0) return Peer::Quiet;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return Peer::Gone;
  return (p.revents & POLLIN) ? Peer::Sent : Peer::Quiet;
}

// One client connection over Stream (a tcp_stream or an ssl_stream of one). Requests are read
// one at a time; the next is read once the answer to the previous one has been written. While a
// request is being answered the connection watches its socket, so that a client that hangs up
// is noticed (Responder::alive() turns false and the job is dropped) before any byte is written.
//
// Deadlines: headers within header_timeout_s of the connection's start (or of the first byte of
// a later request), the body within body_timeout_s of the headers; idle keep-alive connections
// wait idle_timeout_s for that first byte.
template <class Stream>
class Connection : public std::enable_shared_from_this<Connection<Stream>>, public Evictable {
 public:
  Connection(Stream stream, std::shared_ptr<Shared> shared, std::string address)
      : stream_(std::move(stream)),
        shared_(std::move(shared)),
        options_(shared_->options),
        address_(std::move(address)),
        recheck_(stream_.get_executor()) {}
  ~Connection() override {
    shared_->ledger.remove(id_);
    set_busy(false);
    shared_->addresses.release(address_);
    --shared_->open;
    if (shared_->counters) --shared_->counters->connections;
  }

  void start() {
    id_ = shared_->ledger.add(this->weak_from_this(), address_);
    deadline_ = std::chrono::steady_clock::now() + seconds(options_.header_timeout_s);
    if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
      read_request();
    } else {
      lowest().expires_at(deadline_);
      stream_.async_handshake(asio::ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (ec == beast::error::timeout)
                                  self->shared_->count(&ConnectionCounters::header_timeouts);
                                if (ec) return self->close();
                                self->read_request();
                              });
    }
  }

  // Runs on the connection's strand.
  void enqueue(std::string bytes, bool last) {
    if (closed_) return;
    queue_.push_back({std::move(bytes), last});
    if (!writing_) write_next();
  }
  // Any thread: the client does not keep up with its answer; closed, its job stops.
  void drop() {
    if (dropped_.exchange(true)) return;
    asio::post(executor(), [self = this->shared_from_this()] {
      self->shared_->count(&ConnectionCounters::slow_clients_dropped);
      self->close();
    });
  }
  // Any thread: the ledger closes this connection (a slow reader for room, an idle one for a
  // newcomer); it has taken it off its books already.
  void evict(Why) override {
    dropped_ = true;
    asio::post(executor(), [self = this->shared_from_this()] { self->close(); });
  }
  ConnectionLedger& ledger() { return shared_->ledger; }
  uint64_t id() const { return id_; }
  const HttpServerOptions& options() const { return options_; }
  // Any thread: the client is gone (closed, hung up, or dropped as too slow).
  bool gone() const { return closed_ || dropped_; }
  bool keep_alive() const { return keep_alive_; }
  asio::any_io_executor executor() { return stream_.get_executor(); }

 private:
  struct Pending {
    std::string bytes;
    bool last;  // the end of the current response
  };
  class ConnResponder;

  beast::tcp_stream& lowest() { return beast::get_lowest_layer(stream_); }

  // The headers of a request, by deadline_.
  void read_request() {
    parser_.emplace();
    parser_->body_limit(options_.max_body_bytes);
    parser_->header_limit(16 * 1024);
    lowest().expires_at(deadline_);
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  // Keep-alive: waits (idle timeout) for the first byte of the next request, then gives the
  // whole header the header deadline.
  void await_next_request() {
    if (buffer_.size() > 0) {  // pipelined: it is here already
      deadline_ = std::chrono::steady_clock::now() + seconds(options_.header_timeout_s);
      return read_request();
    }
    lowest().expires_after(seconds(options_.idle_timeout_s));
    shared_->ledger.set_idle(id_, true);
    stream_.async_read_some(buffer_.prepare(4096), [self = this->shared_from_this()](
                                                       beast::error_code ec, size_t n) {
      self->shared_->ledger.set_idle(self->id_, false);
      if (ec) return self->close();  // idle timeout, end of stream, reset
      self->buffer_.commit(n);
      self->deadline_ = std::chrono::steady_clock::now() + seconds(self->options_.header_timeout_s);
      self->read_request();
    });
  }

  void on_header(beast::error_code ec) {
    if (ec) return on_read_error(ec, &ConnectionCounters::header_timeouts);
    if (parser_->is_done()) return on_read();
    lowest().expires_after(seconds(options_.body_timeout_s));
    http::async_read(stream_, buffer_, *parser_,
                     [self = this->shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) return self->on_read_error(ec, &ConnectionCounters::body_timeouts);
                       self->on_read();
                     });
  }

  void on_read_error(beast::error_code ec, std::atomic<uint64_t> ConnectionCounters::*timeouts) {
    if (ec == http::error::body_limit) {
      keep_alive_ = false;
      respond_now(413,
                  error_json("too_large", "the request body is over " +
                                              std::to_string(options_.max_body_bytes) + " bytes"));
      return;
    }
    if (ec == http::error::header_limit || ec == http::error::bad_target ||
        ec == http::error::bad_method || ec == http::error::bad_version ||
        ec == http::error::bad_field || ec == http::error::bad_value ||
        ec == http::error::bad_chunk || ec == http::error::bad_content_length ||
        ec == http::error::bad_transfer_encoding || ec == http::error::bad_line_ending) {
      keep_alive_ = false;
      respond_now(400, error_json("bad_request", "malformed HTTP request: " + ec.message()));
      return;
    }
    // A deadline passed (slowloris: too slow to be worth an answer), end of stream, reset.
    if (ec == beast::error::timeout) shared_->count(timeouts);
    close();
  }

  void on_read() {
    lowest().expires_never();
    auto msg = parser_->release();
    keep_alive_ = msg.keep_alive() && !shared_->closing;
    HttpRequest req;
    req.method = std::string(msg.method_string());
    std::string target(msg.target());
    const size_t q = target.find('?');
    req.path = target.substr(0, q);
    if (q != std::string::npos) req.query = target.substr(q + 1);
    for (const auto& f : msg) {
      std::string name(f.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      req.headers[name] = std::string(f.value());
    }
    req.body = std::move(msg.body());
    set_busy(true);
    watch_client();
    auto responder = std::make_shared<ConnResponder>(this->shared_from_this());
    try {
      shared_->handler(req, responder);
    } catch (const std::exception& e) {
      send_json_text(*responder, 500, error_json("internal", "the handler failed"));
    }
  }

  void set_busy(bool busy) {
    if (busy == busy_) return;
    busy_ = busy;
    busy ? ++shared_->busy : --shared_->busy;
  }

  // While a request is answered: wakes when the socket turns readable. Quiet or a hang-up is
  // clear at once; bytes (a pipelined request, a TLS alert) may still be followed by a hang-up,
  // so those are looked at again every second until the answer is written.
  void watch_client() {
    if (watching_ || closed_) return;
    watching_ = true;
    lowest().socket().async_wait(tcp::socket::wait_read,
                                 [self = this->shared_from_this()](beast::error_code ec) {
                                   self->watching_ = false;
                                   if (!ec) self->look_at_client();
                                 });
  }

  void look_at_client() {
    if (!busy_ || closed_) return;
    switch (peer_state(lowest().socket().native_handle())) {
      case Peer::Gone:
        shared_->count(&ConnectionCounters::client_disconnects);
        return close();
      case Peer::Quiet:
        return watch_client();
      case Peer::Sent:
        recheck_.expires_after(std::chrono::seconds(1));
        recheck_.async_wait([self = this->shared_from_this()](beast::error_code ec) {
          if (!ec) self->look_at_client();
        });
        return;
    }
  }

  void respond_now(int status, std::string body) {
    const std::string len = std::to_string(body.size());
    std::string bytes =
        head(status, "application/json", options_.own_answer_headers, keep_alive_, &len) + body;
    // Small, into an empty queue: the ledger takes it (or the connection is closed already).
    shared_->ledger.admit(id_, bytes.size());
    set_busy(true);
    enqueue(std::move(bytes), true);
  }

  void write_next() {
    writing_ = true;
    lowest().expires_after(seconds(options_.write_timeout_s));
    asio::async_write(
        stream_, asio::buffer(queue_.front().bytes),
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    if (closed_) {  // closed while the write was under way (hang-up, slow reader)
      queue_.clear();
      return;
    }
    if (ec == beast::error::timeout) shared_->count(&ConnectionCounters::slow_clients_dropped);
    if (ec) return close();
    const bool last = queue_.front().last;
    shared_->ledger.release(id_, queue_.front().bytes.size());
    queue_.pop_front();
    if (!queue_.empty()) return write_next();
    lowest().expires_never();
    if (!last) return;
    set_busy(false);
    if (keep_alive_ && !shared_->closing) return await_next_request();
    close();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    shared_->ledger.close(id_);
    set_busy(false);
    if (!writing_) queue_.clear();  // else the pending write still reads its front; on_write clears
    recheck_.cancel();
    beast::error_code ec;
    lowest().socket().shutdown(tcp::socket::shutdown_both, ec);
    lowest().close();
  }

  Stream stream_;
  std::shared_ptr<Shared> shared_;
  const HttpServerOptions& options_;
  const std::string address_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::chrono::steady_clock::time_point deadline_;  // for the current request's headers
  std::deque<Pending> queue_;
  asio::steady_timer recheck_;
  uint64_t id_ = 0;                   // in the ledger, which counts the bytes queued
  std::atomic<bool> closed_{false};   // written on the strand, read anywhere
  std::atomic<bool> dropped_{false};  // over the write queue cap; closing
  std::atomic<bool> keep_alive_{true};
  bool writing_ = false;
  bool busy_ = false;      // a request is being answered
  bool watching_ = false;  // an async_wait on the socket is pending
};

// Hands a handler's answer to the connection's strand, from any thread. Every piece is weighed
// by the ledger first (--max-write-queue, --max-write-total): a whole answer over a bound is
// replaced by a short 413 or 503, a stream over one is dropped.
template <class Stream>
class Connection<Stream>::ConnResponder : public Responder {
 public:
  using Admit = ConnectionLedger::Admit;
  explicit ConnResponder(std::shared_ptr<Connection> conn) : conn_(std::move(conn)) {}
  ~ConnResponder() override {
    // A handler that dropped its responder without answering must not leave the client hanging.
    if (streaming_ && !done_) {
      post("0\r\n\r\n", true);
    } else if (!done_) {
      post("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
           true);
    }
  }

  void send(int status, const std::string& content_type, std::string body,
            const HeaderList& headers = {}) override {
    if (done_ || streaming_) return;
    done_ = true;
    const std::string len = std::to_string(body.size());
    const Admit a =
        post(head(status, content_type, headers, conn_->keep_alive(), &len) + body, true);
    if (a == Admit::OverConnection || a == Admit::OverTotal) refuse(a, body.size());
  }
  void start_stream(int status, const std::string& content_type,
                    const HeaderList& headers) override {
    if (done_ || streaming_) return;
    streaming_ = true;
    if (post(head(status, content_type, headers, conn_->keep_alive(), nullptr), false) != Admit::Ok)
      conn_->drop();
  }
  bool write(std::string data) override {
    if (!streaming_ || done_ || conn_->gone()) return false;
    if (!data.empty() && post(chunk(data), false) != Admit::Ok) {
      conn_->drop();  // a stream that cannot be queued cannot be finished either
      return false;
    }
    return !conn_->gone();
  }
  void end() override {
    if (!streaming_ || done_) return;
    done_ = true;
    post("0\r\n\r\n", true);
  }
  bool alive() const override { return !conn_->gone(); }
  Room reserve(size_t bytes) override {
    if (done_ || streaming_ || conn_->gone()) return Room::Ok;  // nothing left to guard
    switch (conn_->ledger().reserve(conn_->id(), bytes)) {
      case Admit::Ok:
        reserved_ += bytes;
        return Room::Ok;
      case Admit::OverConnection:
        return Room::OverConnection;
      case Admit::OverTotal:
        return Room::OverTotal;
      case Admit::Gone:
        break;
    }
    return Room::Ok;  // the client is gone: alive() says so, and the answer goes nowhere
  }

 private:
  // Queues `bytes` once the ledger takes them (a reservation is swapped for them).
  Admit post(std::string bytes, bool last) {
    if (conn_->gone()) return Admit::Gone;
    ConnectionLedger& ledger = conn_->ledger();
    const Admit a = reserved_ > 0 ? ledger.settle(conn_->id(), reserved_, bytes.size())
                                  : ledger.admit(conn_->id(), bytes.size());
    reserved_ = 0;
    if (a != Admit::Ok) return a;
    asio::post(conn_->executor(), [conn = conn_, bytes = std::move(bytes), last]() mutable {
      conn->enqueue(std::move(bytes), last);
    });
    return a;
  }

  // A whole answer the bounds refused: the client learns why in a few bytes, which always fit.
  void refuse(Admit why, size_t size) {
    const bool own = why == Admit::OverConnection;
    const size_t cap =
        own ? conn_->options().max_write_queue_bytes : conn_->options().max_write_total_bytes;
    std::string message = "the answer (";
    message += std::to_string(size);
    message += own ? " bytes) is over the bytes one client may have queued ("
                   : " bytes) does not fit: answers waiting for slow clients fill the server's "
                     "bytes for all clients (";
    message += std::to_string(cap);
    message += own ? "); ask for less" : "); retry later";
    const std::string body = error_json(own ? "too_large" : "unavailable", message);
    HeaderList headers;
    if (!own) headers.push_back({"Retry-After", "1"});
    const std::string len = std::to_string(body.size());
    if (post(head(own ? 413 : 503, "application/json", headers, conn_->keep_alive(), &len) + body,
             true) != Admit::Ok)
      conn_->drop();
  }

  std::shared_ptr<Connection> conn_;
  size_t reserved_ = 0;  // bytes the ledger holds for the coming answer
  bool done_ = false;
  bool streaming_ = false;
};

// A refusal written straight to a fresh socket (it fits the socket's buffer; never blocks), then
// the socket is closed.
void refuse(tcp::socket& socket, const std::string& message) {
  const std::string body = error_json("unavailable", message);
  const std::string bytes =
      "HTTP/1.1 503 Service Unavailable\r\nServer: tandem\r\nRetry-After: 1\r\n"
      "Content-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  beast::error_code ec;
  socket.non_blocking(true, ec);
  asio::write(socket, asio::buffer(bytes), ec);
  socket.shutdown(tcp::socket::shutdown_send, ec);
  socket.close(ec);
}

// A TLS file that cannot be read, named with the reason (OpenSSL's own says "system lib").
void check_readable(const std::string& what, const std::string& file) {
  std::FILE* f = std::fopen(file.c_str(), "rb");
  if (!f) throw Error(what + " '" + file + "': " + std::strerror(errno));
  std::fclose(f);
}

// What is wrong with a TLS file, in words, OpenSSL's reason kept.
std::string tls_problem(const beast::error_code& ec, const std::string& expected) {
  const std::string why = ec.message();
  if (why == "no start line" || why == "unsupported")
    return "not a PEM " + expected + " (OpenSSL: " + why + ")";
  if (why == "key values mismatch")
    return "not the key of the certificate chain (OpenSSL: " + why + ")";
  return why;
}

// The TLS context of options.tls_cert_file and tls_key_file (null without them): TLS 1.2 and
// later, the chain and the key as PEM.
std::unique_ptr<asio::ssl::context> load_tls(const HttpServerOptions& o) {
  if (o.tls_cert_file.empty() && o.tls_key_file.empty()) return nullptr;
  if (o.tls_cert_file.empty() || o.tls_key_file.empty())
    throw Error("TLS needs both a certificate chain and a private key file");
  auto tls = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
  tls->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                   asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                   asio::ssl::context::no_tlsv1_1);
  const std::string cert = "TLS certificate chain", key = "TLS private key";
  beast::error_code ec;
  check_readable(cert, o.tls_cert_file);
  tls->use_certificate_chain_file(o.tls_cert_file, ec);
  if (ec) throw Error(cert + " '" + o.tls_cert_file + "': " + tls_problem(ec, "certificate"));
  check_readable(key, o.tls_key_file);
  tls->use_private_key_file(o.tls_key_file, asio::ssl::context::pem, ec);
  if (ec) throw Error(key + " '" + o.tls_key_file + "': " + tls_problem(ec, "private key"));
  return tls;
}

}  // namespace

// The I/O loop: its context, the threads that run it and the watch for SIGINT and SIGTERM.
struct HttpServer::Loop {
  asio::io_context io;
  // Keeps run() going while nothing is pending (after stop_accepting, between requests).
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::optional<asio::signal_set> signals;
  std::vector<std::thread> threads;
};

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  Impl(asio::io_context& io, const HttpServerOptions& o, HttpHandler h, ConnectionCounters* m)
      : io(io),
        options(o),
        shared(std::make_shared<Shared>(o, std::move(h), m)),
        acceptor(asio::make_strand(io)) {}

  void accept() {
    acceptor.async_accept(asio::make_strand(io),
                          [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
                            if (ec == asio::error::operation_aborted || !self->acceptor.is_open())
                              return;
                            if (!ec) self->on_accept(std::move(socket));
                            self->accept();
                          });
  }

  // At a connection cap the oldest idle keep-alive connection (of the same address, for the
  // per-address cap) is closed to let the newcomer in: an idle client reconnects in one round
  // trip, while a refused one is locked out until some connection closes by itself.
  void on_accept(tcp::socket socket) {
    if (shared->open >= options.max_connections && !shared->ledger.evict_idle(nullptr)) {
      shared->count(&ConnectionCounters::refused_connections_total);
      return refuse(socket, "too many open connections");
    }
    beast::error_code ec;
    const tcp::endpoint peer = socket.remote_endpoint(ec);
    if (ec) return;  // already gone
    std::string address = AddressTable::key_of(peer);
    if (!shared->addresses.try_acquire(address)) {
      if (!shared->ledger.evict_idle(&address)) {
        shared->count(&ConnectionCounters::refused_connections_per_ip);
        return refuse(socket, "too many open connections from this address (the cap is " +
                                  std::to_string(options.max_connections_per_ip) + ")");
      }
      shared->addresses.force_acquire(address);
    }
    ++shared->open;
    if (shared->counters) ++shared->counters->connections;
    socket.set_option(tcp::no_delay(true), ec);
    if (shared->tls) {
      using S = beast::ssl_stream<beast::tcp_stream>;
      std::make_shared<Connection<S>>(S(beast::tcp_stream(std::move(socket)), *shared->tls), shared,
                                      std::move(address))
          ->start();
    } else {
      std::make_shared<Connection<beast::tcp_stream>>(beast::tcp_stream(std::move(socket)), shared,
                                                      std::move(address))
          ->start();
    }
  }

  asio::io_context& io;
  HttpServerOptions options;
  std::shared_ptr<Shared> shared;
  tcp::acceptor acceptor;
};

HttpServer::HttpServer(const HttpServerOptions& options, HttpHandler handler,
                       ConnectionCounters* counters)
    : loop_(std::make_unique<Loop>()),
      impl_(std::make_shared<Impl>(loop_->io, options, std::move(handler), counters)) {}

HttpServer::~HttpServer() {
  stop_accepting();
  stop();
  wait();
  loop_->signals.reset();
  // impl_ goes next, then the loop: the context destroys the handlers still queued on it (and the
  // connections they hold) while it can.
  impl_.reset();
}

void HttpServer::start() {
  impl_->shared->tls = load_tls(impl_->options);
  beast::error_code ec;
  const auto address = asio::ip::make_address(impl_->options.host, ec);
  if (ec) throw Error("--host '" + impl_->options.host + "' is not an IP address: " + ec.message());
  const tcp::endpoint ep(address, static_cast<unsigned short>(impl_->options.port));
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw Error("cannot listen on " + impl_->options.host + ":" +
                std::to_string(impl_->options.port) + ": " + ec.message());
  }
  impl_->accept();
  const int threads = std::max(1, impl_->options.io_threads);
  for (int i = 0; i < threads; ++i) loop_->threads.emplace_back([&io = loop_->io] { io.run(); });
}

int HttpServer::port() const {
  beast::error_code ec;
  return impl_->acceptor.local_endpoint(ec).port();
}

void HttpServer::on_stop_signal(std::function<void(int)> handler) {
  loop_->signals.emplace(loop_->io, SIGINT, SIGTERM);
  loop_->signals->async_wait(
      [handler = std::move(handler)](const beast::error_code& ec, int signal) {
        if (!ec) handler(signal);
      });
}

void HttpServer::stop() {
  loop_->io.stop();
}

void HttpServer::wait() {
  for (auto& t : loop_->threads)
    if (t.joinable()) t.join();
}

void HttpServer::stop_accepting() {
  auto impl = impl_;
  asio::post(impl->acceptor.get_executor(), [impl] {
    beast::error_code ec;
    impl->acceptor.close(ec);
  });
}

bool HttpServer::finish_answers(double timeout_s) {
  impl_->shared->closing = true;
  const auto until = std::chrono::steady_clock::now() + seconds(timeout_s);
  while (impl_->shared->busy > 0) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace tandem::net
