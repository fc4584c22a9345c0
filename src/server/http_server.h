// An HTTP/1.1 server on Boost.Beast/Asio: asynchronous, so hundreds of idle keep-alive
// connections cost a socket and a small buffer each, not a thread; optional TLS (OpenSSL).
//
// The handler runs on an I/O thread and answers through a Responder, now or later from any thread
// (the model's engine thread answers when a job is done). A Responder can send one whole
// response, or open a chunked stream (server-sent events) and write pieces as they come.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace boost::asio {
class io_context;
namespace ssl {
class context;
}
}  // namespace boost::asio

namespace tandem::server {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string path;                            // target without the query string
  std::string query;                           // after '?', undecoded
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

using HeaderList = std::vector<std::pair<std::string, std::string>>;

class Responder {
 public:
  virtual ~Responder() = default;
  // One whole response. Later calls are ignored.
  virtual void send(int status, const std::string& content_type, std::string body,
                    const HeaderList& headers = {}) = 0;
  // Opens a chunked response; then write() pieces and end().
  virtual void start_stream(int status, const std::string& content_type,
                            const HeaderList& headers = {}) = 0;
  // False once the client is gone (the producer should stop).
  virtual bool write(std::string chunk) = 0;
  virtual void end() = 0;
  virtual bool alive() const = 0;
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  size_t max_body_bytes = 1 << 20;
  int max_connections = 1024;   // more are answered 503 and closed
  double idle_timeout_s = 300;  // a keep-alive connection with no request this long is closed
  double write_timeout_s = 60;  // a client that does not read its answer this long is dropped
  boost::asio::ssl::context* ssl = nullptr;  // TLS when set
};

using HttpHandler = std::function<void(const HttpRequest&, std::shared_ptr<Responder>)>;

class HttpServer {
 public:
  HttpServer(boost::asio::io_context& io, const HttpServerOptions& options, HttpHandler handler,
             std::atomic<int64_t>* connection_gauge = nullptr);
  ~HttpServer();
  // Binds and listens; throws tandem::Error naming the address when it cannot.
  void start();
  int port() const;  // the bound port (useful with port 0)
  void stop_accepting();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// Reason phrase and status line helpers shared by handlers.
const char* status_reason(int status);

}  // namespace tandem::server
