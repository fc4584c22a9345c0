// The HTTP server on its own I/O loop: it answers on the threads it owns, stops and is waited for,
// turns SIGTERM into a call on its loop, serves TLS from PEM files and names the file and the
// problem when one is wrong; and the one error body (error_json) in its exact bytes.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <utility>  // before Boost 1.74's asio (std::exchange)

#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "tandem/error.h"
#include "tandem/http_server.h"

namespace tandem::net {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct Answer {
  int status = 0;
  std::string body;
};

template <class Stream>
Answer exchange(Stream& s, const std::string& target) {
  http::request<http::string_body> req(http::verb::get, target, 11);
  req.set(http::field::host, "127.0.0.1");
  req.keep_alive(false);
  http::write(s, req);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(s, buffer, res);
  return {static_cast<int>(res.result_int()), res.body()};
}

Answer get(int port, const std::string& target, asio::ssl::context* tls = nullptr) {
  asio::io_context io;
  const tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port));
  if (tls) {
    beast::ssl_stream<beast::tcp_stream> s(io, *tls);
    beast::get_lowest_layer(s).connect(ep);
    s.handshake(asio::ssl::stream_base::client);
    return exchange(s, target);
  }
  beast::tcp_stream s(io);
  s.connect(ep);
  return exchange(s, target);
}

HttpHandler echo_path() {
  return [](const HttpRequest& req, std::shared_ptr<Responder> res) {
    res->send(200, "text/plain", "path " + req.path);
  };
}

HttpServerOptions any_port() {
  HttpServerOptions o;
  o.port = 0;
  o.io_threads = 1;
  return o;
}

TEST(HttpServer, AnswersOnItsOwnThreadsUntilStopped) {
  HttpServer server(any_port(), echo_path());
  server.start();
  const Answer a = get(server.port(), "/hello");
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body, "path /hello");
  server.stop_accepting();
  server.stop();
  server.wait();  // returns: the loop's threads are done
}

TEST(HttpServer, DestroyedWhileRunningStopsItsLoop) {
  auto server = std::make_unique<HttpServer>(any_port(), echo_path());
  server->start();
  EXPECT_EQ(get(server->port(), "/").status, 200);
  server.reset();  // stops and joins by itself
}

TEST(HttpServer, TheStopSignalRunsOnTheLoop) {
  HttpServer server(any_port(), echo_path());
  server.start();
  std::atomic<int> got{0};
  server.on_stop_signal([&](int signal) {
    got = signal;
    server.stop_accepting();
    server.stop();
  });
  ASSERT_EQ(::kill(::getpid(), SIGTERM), 0);
  server.wait();  // the handler stopped the loop
  EXPECT_EQ(got.load(), SIGTERM);
}

TEST(HttpServer, ErrorJsonIsTheOneShape) {
  EXPECT_EQ(error_json("unavailable", "loading model"),
            R"({"error":{"code":"unavailable","message":"loading model"}})");
  // Extra members in key order with code and message, whatever order they come in.
  EXPECT_EQ(error_json("bad_request", "'n' is bad", R"({"limit":64,"field":"n"})"),
            R"({"error":{"code":"bad_request","field":"n","limit":64,"message":"'n' is bad"}})");
  EXPECT_EQ(error_json("x", "quote \" and \\ and \n"),
            R"({"error":{"code":"x","message":"quote \" and \\ and \n"}})");
  // A token piece that splits a character: U+FFFD, not an exception.
  EXPECT_EQ(error_json("x", std::string("a\xe2\x82")),
            "{\"error\":{\"code\":\"x\",\"message\":\"a\xef\xbf\xbd\"}}");
}

// A self-signed certificate and its key, and a second key that is not its own.
class HttpServerTls : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("tandem-http-tls-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    cert_ = (dir_ / "cert.pem").string();
    key_ = (dir_ / "key.pem").string();
    other_key_ = (dir_ / "other.pem").string();
    const std::string cmd =
        "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 -keyout " + key_ +
        " -out " + cert_ + " >/dev/null 2>&1 && openssl genrsa -out " + other_key_ +
        " 2048 >/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl could not make a test certificate";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The message of the Error that start() throws with these files.
  static std::string start_error(const std::string& cert, const std::string& key) {
    HttpServerOptions o = any_port();
    o.tls_cert_file = cert;
    o.tls_key_file = key;
    HttpServer server(o, echo_path());
    try {
      server.start();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }

  std::filesystem::path dir_;
  std::string cert_, key_, other_key_;
};

TEST_F(HttpServerTls, ServesTlsFromPemFiles) {
  HttpServerOptions o = any_port();
  o.tls_cert_file = cert_;
  o.tls_key_file = key_;
  HttpServer server(o, echo_path());
  server.start();
  asio::ssl::context client(asio::ssl::context::tls_client);
  client.set_verify_mode(asio::ssl::verify_none);
  const Answer a = get(server.port(), "/secure", &client);
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body, "path /secure");
}

TEST_F(HttpServerTls, AWrongFileIsNamedWithWhatIsWrong) {
  const std::string missing = (dir_ / "missing.pem").string();
  const std::string text = (dir_ / "text.pem").string();
  std::ofstream(text) << "not a certificate\n";

  std::string e = start_error(missing, key_);
  EXPECT_NE(e.find("TLS certificate chain '" + missing + "'"), std::string::npos) << e;
  EXPECT_NE(e.find("No such file or directory"), std::string::npos) << e;

  e = start_error(text, key_);
  EXPECT_NE(e.find("TLS certificate chain '" + text + "': not a PEM certificate"),
            std::string::npos)
      << e;

  e = start_error(cert_, missing);
  EXPECT_NE(e.find("TLS private key '" + missing + "'"), std::string::npos) << e;
  EXPECT_NE(e.find("No such file or directory"), std::string::npos) << e;

  e = start_error(cert_, text);
  EXPECT_NE(e.find("TLS private key '" + text + "': not a PEM private key"), std::string::npos)
      << e;

  e = start_error(cert_, other_key_);
  EXPECT_NE(e.find("TLS private key '" + other_key_ + "': not the key of the certificate chain"),
            std::string::npos)
      << e;

  e = start_error(cert_, "");
  EXPECT_NE(e.find("TLS needs both"), std::string::npos) << e;
}

}  // namespace
}  // namespace tandem::net
