#include "server/http_server.h"

// <utility> first: Boost 1.74's asio/awaitable.hpp uses std::exchange without including it.
#include <optional>
#include <utility>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cctype>
#include <deque>
#include <string>

#include "common/error.h"

namespace tandem::server {

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

// One client connection over Stream (a tcp_stream or an ssl_stream of one). Requests are read
// one at a time; the next is read once the answer to the previous one has been written.
template <class Stream>
class Connection : public std::enable_shared_from_this<Connection<Stream>> {
 public:
  Connection(Stream stream, const HttpServerOptions& options, const HttpHandler& handler,
             std::atomic<int64_t>* gauge)
      : stream_(std::move(stream)), options_(options), handler_(handler), gauge_(gauge) {
    if (gauge_) ++*gauge_;
  }
  ~Connection() {
    if (gauge_) --*gauge_;
  }

  void start() {
    if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
      read_next();
    } else {
      lowest().expires_after(std::chrono::seconds(30));
      stream_.async_handshake(asio::ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (!ec) self->read_next();
                              });
    }
  }

  // Runs on the connection's strand.
  void enqueue(std::string bytes, bool last) {
    if (closed_) return;
    queue_.push_back({std::move(bytes), last});
    if (!writing_) write_next();
  }
  bool closed() const { return closed_; }
  asio::any_io_executor executor() { return stream_.get_executor(); }

 private:
  struct Pending {
    std::string bytes;
    bool last;  // the end of the current response
  };
  class ConnResponder;

  beast::tcp_stream& lowest() { return beast::get_lowest_layer(stream_); }

  void read_next() {
    parser_.emplace();
    parser_->body_limit(options_.max_body_bytes);
    parser_->header_limit(16 * 1024);
    lowest().expires_after(
        std::chrono::milliseconds(static_cast<int64_t>(options_.idle_timeout_s * 1000)));
    http::async_read(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      keep_alive_ = false;
      respond_now(413,
                  "{\"error\":{\"code\":\"too_large\",\"message\":\"the request body is over " +
                      std::to_string(options_.max_body_bytes) + " bytes\"}}");
      return;
    }
    if (ec == http::error::header_limit || ec == http::error::bad_target ||
        ec == http::error::bad_method || ec == http::error::bad_version ||
        ec == http::error::bad_field || ec == http::error::bad_value ||
        ec == http::error::bad_chunk || ec == http::error::bad_content_length ||
        ec == http::error::bad_transfer_encoding || ec == http::error::bad_line_ending) {
      keep_alive_ = false;
      respond_now(400,
                  "{\"error\":{\"code\":\"bad_request\",\"message\":\"malformed HTTP request: " +
                      ec.message() + "\"}}");
      return;
    }
    if (ec) return close();  // timeout, end of stream, reset
    lowest().expires_never();
    auto msg = parser_->release();
    keep_alive_ = msg.keep_alive();
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
    auto responder = std::make_shared<ConnResponder>(this->shared_from_this());
    try {
      handler_(req, responder);
    } catch (const std::exception& e) {
      responder->send(500, "application/json",
                      std::string("{\"error\":{\"code\":\"internal\",\"message\":\"") +
                          "the handler failed\"}}");
    }
  }

  void respond_now(int status, std::string body) {
    const std::string len = std::to_string(body.size());
    enqueue(head(status, "application/json", {}, keep_alive_, &len) + body, true);
  }

  void write_next() {
    writing_ = true;
    lowest().expires_after(
        std::chrono::milliseconds(static_cast<int64_t>(options_.write_timeout_s * 1000)));
    asio::async_write(
        stream_, asio::buffer(queue_.front().bytes),
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    if (ec) return close();
    const bool last = queue_.front().last;
    queue_.pop_front();
    if (!queue_.empty()) return write_next();
    lowest().expires_never();
    if (last) {
      if (keep_alive_) {
        read_next();
      } else {
        close();
      }
    }
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    queue_.clear();
    beast::error_code ec;
    lowest().socket().shutdown(tcp::socket::shutdown_both, ec);
    lowest().close();
  }

  Stream stream_;
  const HttpServerOptions& options_;
  const HttpHandler& handler_;
  std::atomic<int64_t>* gauge_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<Pending> queue_;
  bool writing_ = false;
  bool closed_ = false;
  bool keep_alive_ = true;

 public:
  bool keep_alive() const { return keep_alive_; }
};

// Hands a handler's answer to the connection's strand, from any thread.
template <class Stream>
class Connection<Stream>::ConnResponder : public Responder {
 public:
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
    post(head(status, content_type, headers, conn_->keep_alive(), &len) + body, true);
  }
  void start_stream(int status, const std::string& content_type,
                    const HeaderList& headers) override {
    if (done_ || streaming_) return;
    streaming_ = true;
    post(head(status, content_type, headers, conn_->keep_alive(), nullptr), false);
  }
  bool write(std::string data) override {
    if (!streaming_ || done_ || *gone_) return false;
    if (!data.empty()) post(chunk(data), false);
    return !*gone_;
  }
  void end() override {
    if (!streaming_ || done_) return;
    done_ = true;
    post("0\r\n\r\n", true);
  }
  bool alive() const override { return !*gone_; }

 private:
  void post(std::string bytes, bool last) {
    asio::post(conn_->executor(),
               [conn = conn_, bytes = std::move(bytes), last, gone = gone_]() mutable {
                 if (conn->closed()) {
                   *gone = true;
                   return;
                 }
                 conn->enqueue(std::move(bytes), last);
               });
  }

  std::shared_ptr<Connection> conn_;
  // Set on the strand once the connection is found closed; read from the producer's thread.
  std::shared_ptr<std::atomic<bool>> gone_ = std::make_shared<std::atomic<bool>>(false);
  bool done_ = false;
  bool streaming_ = false;
};

}  // namespace

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  Impl(asio::io_context& io, const HttpServerOptions& o, HttpHandler h, std::atomic<int64_t>* g)
      : io(io), options(o), handler(std::move(h)), gauge(g), acceptor(asio::make_strand(io)) {}

  void accept() {
    acceptor.async_accept(asio::make_strand(io),
                          [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
                            if (ec == asio::error::operation_aborted || !self->acceptor.is_open())
                              return;
                            if (!ec) self->on_accept(std::move(socket));
                            self->accept();
                          });
  }

  void on_accept(tcp::socket socket) {
    if (gauge && *gauge >= options.max_connections) {
      static const std::string busy =
          "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
          "Content-Length: 71\r\nConnection: close\r\n\r\n"
          "{\"error\":{\"code\":\"unavailable\",\"message\":\"too many open connections\"}}";
      beast::error_code ec;
      asio::write(socket, asio::buffer(busy), ec);
      socket.close(ec);
      return;
    }
    beast::error_code ec;
    socket.set_option(tcp::no_delay(true), ec);
    if (options.ssl) {
      using S = beast::ssl_stream<beast::tcp_stream>;
      std::make_shared<Connection<S>>(S(beast::tcp_stream(std::move(socket)), *options.ssl),
                                      options, handler, gauge)
          ->start();
    } else {
      std::make_shared<Connection<beast::tcp_stream>>(beast::tcp_stream(std::move(socket)), options,
                                                      handler, gauge)
          ->start();
    }
  }

  asio::io_context& io;
  HttpServerOptions options;
  HttpHandler handler;
  std::atomic<int64_t>* gauge;
  tcp::acceptor acceptor;
};

HttpServer::HttpServer(asio::io_context& io, const HttpServerOptions& options, HttpHandler handler,
                       std::atomic<int64_t>* connection_gauge)
    : impl_(std::make_shared<Impl>(io, options, std::move(handler), connection_gauge)) {}

HttpServer::~HttpServer() {
  stop_accepting();
}

void HttpServer::start() {
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
}

int HttpServer::port() const {
  beast::error_code ec;
  return impl_->acceptor.local_endpoint(ec).port();
}

void HttpServer::stop_accepting() {
  auto impl = impl_;
  asio::post(impl->acceptor.get_executor(), [impl] {
    beast::error_code ec;
    impl->acceptor.close(ec);
  });
}

}  // namespace tandem::server
