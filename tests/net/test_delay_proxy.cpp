// The loopback delay proxy of tandem eval --rtt-ms: bytes pass intact and in order both ways
// (with jitter too), closing is passed on, and no round trip through it is shorter than the delay
// it adds.
#include <gtest/gtest.h>

#include <utility>  // before Boost 1.74's asio (std::exchange)

#include <boost/asio.hpp>
#include <chrono>
#include <thread>

#include "tandem/delay_proxy.h"

namespace tandem::net {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// An echo server on 127.0.0.1 that serves one connection until the peer closes.
struct EchoServer {
  asio::io_context io;
  tcp::acceptor acceptor{io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)};
  std::thread thread{[this] {
    tcp::socket s(io);
    acceptor.accept(s);
    std::array<char, 4096> buf;
    boost::system::error_code ec;
    for (;;) {
      const size_t n = s.read_some(asio::buffer(buf), ec);
      if (ec) break;
      asio::write(s, asio::buffer(buf.data(), n), ec);
      if (ec) break;
    }
  }};
  ~EchoServer() { thread.join(); }
  uint16_t port() const { return acceptor.local_endpoint().port(); }
};

// With and without jitter (which delays chunks by different amounts, but never reorders them).
void relays_intact_in_order_and_adds_the_round_trip(double jitter_ms) {
  SCOPED_TRACE(jitter_ms);
  EchoServer echo;
  DelayProxy proxy("127.0.0.1", echo.port(), 40, jitter_ms);
  asio::io_context io;
  tcp::socket s(io);
  s.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), proxy.port()));
  // A megabyte in pieces: comes back whole and in order.
  std::string sent;
  for (int i = 0; i < 1 << 20; ++i) sent.push_back(static_cast<char>((i * 131) ^ (i >> 7)));
  std::thread writer([&] { asio::write(s, asio::buffer(sent)); });
  std::string got(sent.size(), '\0');
  asio::read(s, asio::buffer(got));
  writer.join();
  EXPECT_EQ(got, sent);
  // A small request/answer round trip takes at least the added delay.
  const auto t0 = std::chrono::steady_clock::now();
  asio::write(s, asio::buffer(std::string("ping")));
  std::string pong(4, '\0');
  asio::read(s, asio::buffer(pong));
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(pong, "ping");
  EXPECT_GE(ms, 40.0);
  // Closing our side is passed on: the echo server sees the end and closes, and so do we.
  s.shutdown(tcp::socket::shutdown_send);
  std::array<char, 16> rest;
  boost::system::error_code ec;
  s.read_some(asio::buffer(rest), ec);
  EXPECT_EQ(ec, asio::error::eof);
}

TEST(DelayProxy, RelaysIntactInOrderAndAddsTheRoundTrip) {
  relays_intact_in_order_and_adds_the_round_trip(0);
}

TEST(DelayProxy, WithJitterStillRelaysIntactInOrder) {
  relays_intact_in_order_and_adds_the_round_trip(30);
}

}  // namespace
}  // namespace tandem::net
