// Test harness for network tests: starts a real `tandem serve` process on 127.0.0.1 with a free
// port, waits for /health, and stops it (SIGTERM, then SIGKILL after a grace period). A small
// synchronous HTTP/1.1 client on Boost.Beast (plain or TLS) talks to it over real sockets.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <utility>  // before Boost 1.74's asio (std::exchange)

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace tandem::testing {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using json = nlohmann::json;

// A port nobody listens on right now (the kernel's choice for an ephemeral bind).
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("bind");
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

struct HttpResult {
  int status = 0;
  std::string body;
  std::string retry_after;
  json j() const { return json::parse(body, nullptr, false); }
};

// One keep-alive connection; reconnects when the server closed it.
class TestClient {
 public:
  explicit TestClient(int port, bool tls = false, std::string api_key = "")
      : port_(port),
        tls_(tls),
        api_key_(std::move(api_key)),
        ssl_ctx_(asio::ssl::context::tls_client) {
    ssl_ctx_.set_verify_mode(asio::ssl::verify_none);
  }

  HttpResult request(const std::string& method, const std::string& target,
                     const std::string& body = "", double timeout_s = 120) {
    for (int attempt = 0;; ++attempt) {
      try {
        return request_once(method, target, body, timeout_s);
      } catch (const std::exception&) {
        reset();
        if (attempt >= 1) throw;
      }
    }
  }
  HttpResult post(const std::string& target, const json& body, double timeout_s = 120) {
    return request("POST", target, body.dump(), timeout_s);
  }
  HttpResult get(const std::string& target) { return request("GET", target); }

  void reset() {
    plain_.reset();
    secure_.reset();
  }

 private:
  template <class Stream>
  HttpResult exchange(Stream& s, const std::string& method, const std::string& target,
                      const std::string& body, double timeout_s) {
    http::request<http::string_body> req(http::string_to_verb(method), target, 11);
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::content_type, "application/json");
    if (!api_key_.empty()) req.set(http::field::authorization, "Bearer " + api_key_);
    req.keep_alive(true);
    req.body() = body;
    req.prepare_payload();
    beast::get_lowest_layer(s).expires_after(
        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    http::write(s, req);
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 << 20);
    http::read(s, buffer_, parser);
    auto res = parser.release();
    HttpResult out;
    out.status = static_cast<int>(res.result_int());
    out.body = res.body();
    if (res.count(http::field::retry_after))
      out.retry_after = std::string(res[http::field::retry_after]);
    if (!res.keep_alive()) reset();
    return out;
  }

  HttpResult request_once(const std::string& method, const std::string& target,
                          const std::string& body, double timeout_s) {
    const asio::ip::tcp::endpoint ep(asio::ip::make_address("127.0.0.1"),
                                     static_cast<unsigned short>(port_));
    if (tls_) {
      if (!secure_) {
        secure_.emplace(io_, ssl_ctx_);
        beast::get_lowest_layer(*secure_).connect(ep);
        secure_->handshake(asio::ssl::stream_base::client);
      }
      return exchange(*secure_, method, target, body, timeout_s);
    }
    if (!plain_) {
      plain_.emplace(io_);
      plain_->connect(ep);
    }
    return exchange(*plain_, method, target, body, timeout_s);
  }

  int port_;
  bool tls_;
  std::string api_key_;
  asio::io_context io_;
  asio::ssl::context ssl_ctx_;
  beast::flat_buffer buffer_;
  std::optional<beast::tcp_stream> plain_;
  std::optional<beast::ssl_stream<beast::tcp_stream>> secure_;
};

// `tandem serve` in a child process.
class ServerProcess {
 public:
  ServerProcess(const std::string& model, std::vector<std::string> extra = {}, bool tls = false,
                std::string api_key = "")
      : port_(free_port()), tls_(tls), api_key_(std::move(api_key)) {
    std::vector<std::string> args = {TANDEM_BINARY, "serve",     "-m",     model,
                                     "--host",      "127.0.0.1", "--port", std::to_string(port_),
                                     "-t",          "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      // A test that dies (an ASan report, a crash) takes its server with it: an orphan would keep
      // ctest's output pipe open and hang the whole run.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    wait_healthy();
  }
  ~ServerProcess() { stop(); }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  TestClient client() const { return TestClient(port_, tls_, api_key_); }

  // Sends SIGTERM and waits for the exit status (SIGKILL after `grace_s`).
  int stop(double grace_s = 20) {
    if (pid_ <= 0) return exit_code_;
    kill(pid_, SIGTERM);
    const auto t0 = std::chrono::steady_clock::now();
    int status = 0;
    for (;;) {
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) break;
      if (std::chrono::steady_clock::now() - t0 > std::chrono::duration<double>(grace_s)) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        exit_code_ = -9;
        pid_ = -1;
        return exit_code_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_ = -1;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    return exit_code_;
  }

 private:
  void wait_healthy() {
    const auto t0 = std::chrono::steady_clock::now();
    TestClient c(port_, tls_, api_key_);
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("tandem serve exited during start-up");
      }
      try {
        if (c.get("/health").status == 200) return;
      } catch (const std::exception&) {
        c.reset();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    throw std::runtime_error("tandem serve did not become healthy within 60 s");
  }

  int port_;
  bool tls_;
  std::string api_key_;
  pid_t pid_ = -1;
  int exit_code_ = 0;
};

}  // namespace tandem::testing
