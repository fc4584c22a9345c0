// An HTTP/1.1 server on Boost.Beast/Asio: asynchronous, so hundreds of idle keep-alive
// connections cost a socket and a small buffer each, not a thread; optional TLS (OpenSSL).
// The server owns its I/O loop and the threads that run it (HttpServerOptions::io_threads), and
// reads its TLS certificate and key from files: this header names no outside library.
//
//   tandem::net::HttpServerOptions options;
//   options.port = 0;  // any free port
//   tandem::net::HttpServer server(options, [](const tandem::net::HttpRequest& request,
//                                              std::shared_ptr<tandem::net::Responder> res) {
//     res->send(200, "text/plain", "hello " + request.path);
//   });
//   server.on_stop_signal([&server](int) { server.stop(); });  // SIGINT or SIGTERM
//   server.start();  // listens and starts the I/O threads
//   std::printf("port %d\n", server.port());
//   server.stop();   // normally from the signal handler
//   server.wait();   // until the I/O threads have returned
//
// The handler runs on an I/O thread and answers through a Responder, now or later from any thread
// (the model's engine thread answers when a job is done). A Responder can send one whole
// response, or open a chunked stream (server-sent events) and write pieces as they come.
//
// Implemented in src/net (tandem_net). Public because both the cloud server (`tandem serve`) and
// the browser view (`tandem ui`, which includes only include/tandem/) stand on it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::net {

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
  // False once the client is gone (it hung up, or its write queue went over the cap and the
  // connection was dropped): the producer should stop.
  virtual bool write(std::string chunk) = 0;
  virtual void end() = 0;
  // False once the client is gone, noticed even while nothing is written (the connection watches
  // its socket while a request is being answered).
  virtual bool alive() const = 0;

  // Room for an answer of at most `bytes`, asked before the work that makes it, so that an answer
  // that could not be queued is refused before it is built. Ok holds the room until the answer is
  // sent; OverConnection: over --max-write-queue (the handler answers 413); OverTotal: the
  // server's --max-write-total is taken by other answers (503 with Retry-After).
  enum class Room { Ok, OverConnection, OverTotal };
  virtual Room reserve(size_t bytes) {
    (void)bytes;
    return Room::Ok;
  }
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  size_t max_body_bytes = 1 << 20;
  int max_connections = 1024;  // more are answered 503 and closed
  // Connections from one address (IPv6: one /64) at most; more are answered 503 and closed.
  // 0: no per-address cap (behind a proxy every client has the proxy's address).
  int max_connections_per_ip = 64;
  // From the connection's start (TLS handshake included), or from the first byte of a later
  // request on a keep-alive connection, to the end of the request's headers.
  double header_timeout_s = 10;
  double body_timeout_s = 30;   // from the end of the headers to the end of the body
  double idle_timeout_s = 300;  // a keep-alive connection with no request this long is closed
  double write_timeout_s = 60;  // a client that does not read its answer this long is dropped
  // Answer bytes waiting to be written to one client at most, the piece being written included:
  // a stream read slower than it is produced is dropped; a whole answer over it is answered 413.
  size_t max_write_queue_bytes = 8u << 20;
  // Answer bytes waiting for all clients together at most. At it, clients that have left bytes
  // unread longest (over slow_reader_grace_s) are closed to make room; else a whole answer is
  // answered 503 with Retry-After and a stream is dropped.
  size_t max_write_total_bytes = 64u << 20;
  // A client is closed to make room in max_write_total_bytes only once it has left its answer
  // unread this long: one that reads a large answer at speed is never pushed out.
  double slow_reader_grace_s = 1;
  // An answer piece this small into an empty queue is taken whatever the bounds say, so that
  // errors and short answers never fail for them.
  size_t small_answer_bytes = 16u << 10;
  // TLS (OpenSSL): both or neither, PEM files read by start(); empty: plain HTTP.
  std::string tls_cert_file;  // the certificate chain
  std::string tls_key_file;   // its private key
  int io_threads = 2;         // threads that run the server's I/O loop (handlers run on them)
  // Added to the answers the server gives itself, before any handler runs (413 for a body over
  // the limit, 400 for a malformed request): `tandem ui` passes its security headers here.
  HeaderList own_answer_headers;
};

using HttpHandler = std::function<void(const HttpRequest&, std::shared_ptr<Responder>)>;

// What the server counts about its connections: the gauge of open ones, the refusals
// (max_connections, max_connections_per_ip), the deadlines passed (headers, body), the clients
// dropped for not reading (write queue cap, write timeout) and those that hung up while their
// request was being answered, the answer bytes queued in all and what their bounds refused, and
// the connections closed to make room (slow readers, idle keep-alive connections). Updated from the
// I/O threads; the cloud server's Prometheus metrics (server::Metrics) are built on it.
struct ConnectionCounters {
  std::atomic<uint64_t> refused_connections_total{0};
  std::atomic<uint64_t> refused_connections_per_ip{0};
  std::atomic<uint64_t> header_timeouts{0};
  std::atomic<uint64_t> body_timeouts{0};
  std::atomic<uint64_t> slow_clients_dropped{0};
  std::atomic<uint64_t> client_disconnects{0};
  std::atomic<int64_t> connections{0};
  std::atomic<int64_t> write_queued_bytes{0};
  std::atomic<uint64_t> answers_refused_connection{0};  // over --max-write-queue
  std::atomic<uint64_t> answers_refused_total{0};       // over --max-write-total
  std::atomic<uint64_t> slow_clients_evicted{0};        // closed to make room in the total
  std::atomic<uint64_t> idle_connections_evicted{0};    // closed to let a new connection in
};

class HttpServer {
 public:
  // `counters` (optional) gets the connection gauge and the refusals, timeouts and drops.
  HttpServer(const HttpServerOptions& options, HttpHandler handler,
             ConnectionCounters* counters = nullptr);
  // Stops the I/O loop and waits for its threads (never from one of them). What the handler kept
  // of a request (a Responder) must be let go before: its connection lives on the server's loop.
  ~HttpServer();
  // Reads the TLS files (when set), binds, listens and starts options.io_threads threads on the
  // I/O loop. Throws tandem::Error naming the address, or the file and what is wrong with it.
  void start();
  int port() const;  // the bound port (useful with port 0)
  void stop_accepting();
  // Shutdown: answers from now on say "Connection: close" and their connections close once the
  // answer is written. Then waits (at most `timeout_s`) until no connection has an answer
  // pending; false when some still had.
  bool finish_answers(double timeout_s);
  // `handler(signal)` runs once, on an I/O thread, when the process gets SIGINT or SIGTERM (from
  // this call on, until the server stops). Usually it stops accepting, then stop()s.
  void on_stop_signal(std::function<void(int)> handler);
  // Stops the I/O loop: its threads return once their current handler does; work still queued is
  // dropped. Any thread, a handler's included; returns at once.
  void stop();
  // Until the I/O threads have returned (after stop()). Not from an I/O thread.
  void wait();

 private:
  struct Loop;  // the I/O loop, its threads and the signal watch
  struct Impl;
  std::unique_ptr<Loop> loop_;  // declared first: outlives what runs on it
  std::shared_ptr<Impl> impl_;
};

// Reason phrase and status line helpers shared by handlers.
const char* status_reason(int status);

// A JSON answer: `json_text` as the body, with Content-Type: application/json. The one JSON
// reply of the cloud server and the browser view; each writes the text with its own JSON
// library, so that this header (which the browser view includes) names none.
void send_json_text(Responder& responder, int status, std::string json_text,
                    const HeaderList& headers = {});

// The one shape of an error answer, the cloud server's, the browser view's and this server's own:
// {"error":{"code":CODE,"message":MESSAGE,...}} as JSON text. `extra_members` (JSON text of an
// object, or empty) adds members to the error object, such as {"field":"n_predict"}; members are
// written in key order, and bytes of invalid UTF-8 in any string become U+FFFD.
std::string error_json(std::string_view code, std::string_view message,
                       std::string_view extra_members = {});

}  // namespace tandem::net
