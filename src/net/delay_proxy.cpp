#include "tandem/delay_proxy.h"

#include <utility>  // before Boost 1.74's asio (std::exchange)

#include <boost/asio.hpp>
#include <chrono>
#include <deque>
#include <random>
#include <thread>

#include "common/error.h"
#include "common/splitmix.h"
#include "net/http_client.h"

namespace tandem::net {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// One direction of one connection: read a chunk, hold it until its due time, write it, in order.
// A chunk is due `delay` after it arrived, plus a random 0..jitter; never before the one ahead.
class Pipe : public std::enable_shared_from_this<Pipe> {
 public:
  Pipe(std::shared_ptr<tcp::socket> from, std::shared_ptr<tcp::socket> to, Clock::duration delay,
       Clock::duration jitter, uint64_t seed)
      : from_(std::move(from)),
        to_(std::move(to)),
        delay_(delay),
        jitter_(jitter),
        random_(seed),
        timer_(from_->get_executor()) {}

  void start() { read(); }

 private:
  struct Chunk {
    Clock::time_point due;
    std::string bytes;
  };

  void read() {
    from_->async_read_some(
        asio::buffer(buf_), [self = shared_from_this()](boost::system::error_code ec, size_t n) {
          if (ec) {
            self->eof_ = true;
            if (self->queue_.empty() && !self->writing_) self->shutdown();
            return;
          }
          self->queue_.push_back({self->due(), std::string(self->buf_.data(), n)});
          if (!self->writing_) self->write_next();
          self->read();
        });
  }

  void write_next() {
    if (queue_.empty()) {
      writing_ = false;
      if (eof_) shutdown();
      return;
    }
    writing_ = true;
    timer_.expires_at(queue_.front().due);
    timer_.async_wait([self = shared_from_this()](boost::system::error_code) {
      asio::async_write(*self->to_, asio::buffer(self->queue_.front().bytes),
                        [self](boost::system::error_code ec, size_t) {
                          self->queue_.pop_front();
                          if (ec) {
                            self->shutdown();
                            return;
                          }
                          self->write_next();
                        });
    });
  }

  Clock::time_point due() {
    Clock::time_point t = Clock::now() + delay_;
    if (jitter_.count() > 0) {
      const double share = unit_interval(splitmix64(random_));
      t += Clock::duration(static_cast<Clock::rep>(share * static_cast<double>(jitter_.count())));
    }
    if (!queue_.empty()) t = std::max(t, queue_.back().due);
    return t;
  }

  // The sender closed: pass the end on (half-close), as a real network would.
  void shutdown() {
    boost::system::error_code ec;
    to_->shutdown(tcp::socket::shutdown_send, ec);
  }

  std::shared_ptr<tcp::socket> from_, to_;
  Clock::duration delay_, jitter_;
  uint64_t random_;  // splitmix64 state
  asio::steady_timer timer_;
  std::array<char, 16384> buf_{};
  std::deque<Chunk> queue_;
  bool writing_ = false, eof_ = false;
};

}  // namespace

struct DelayProxy::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  tcp::endpoint target;
  Clock::duration half_rtt, half_jitter;
  uint64_t seeds = std::random_device{}();  // splitmix64 state: each pipe's seed
  std::thread thread;

  void accept() {
    acceptor.async_accept([this](boost::system::error_code ec, tcp::socket client) {
      if (ec) return;
      auto down = std::make_shared<tcp::socket>(std::move(client));
      auto up = std::make_shared<tcp::socket>(io);
      up->async_connect(target, [this, down, up](boost::system::error_code ec2) {
        if (ec2) {
          boost::system::error_code ignore;
          down->close(ignore);
          return;
        }
        boost::system::error_code ignore;
        up->set_option(tcp::no_delay(true), ignore);
        down->set_option(tcp::no_delay(true), ignore);
        std::make_shared<Pipe>(down, up, half_rtt, half_jitter, splitmix64(seeds))->start();
        std::make_shared<Pipe>(up, down, half_rtt, half_jitter, splitmix64(seeds))->start();
      });
      accept();
    });
  }
};

DelayProxy::DelayProxy(const std::string& target_host, uint16_t target_port, double rtt_ms,
                       double jitter_ms)
    : impl_(std::make_unique<Impl>()) {
  boost::system::error_code ec;
  const auto addr =
      asio::ip::make_address(target_host == "localhost" ? "127.0.0.1" : target_host, ec);
  if (ec) throw Error("delay proxy: the target must be an IP address, found '" + target_host + "'");
  impl_->target = tcp::endpoint(addr, target_port);
  impl_->half_rtt = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(rtt_ms / 2));
  impl_->half_jitter = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(jitter_ms / 2));
  const tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
  impl_->acceptor.open(ep.protocol());
  impl_->acceptor.set_option(asio::socket_base::reuse_address(true));
  impl_->acceptor.bind(ep);
  impl_->acceptor.listen();
  impl_->accept();
  impl_->thread = std::thread([this] { impl_->io.run(); });
}

DelayProxy::~DelayProxy() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint16_t DelayProxy::port() const {
  return impl_->acceptor.local_endpoint().port();
}

DelayedUrl delay_url(const std::string& url, double rtt_ms) {
  const Url u = parse_url(url);
  DelayedUrl d;
  d.proxy = std::make_unique<DelayProxy>(u.host, u.port, rtt_ms);
  d.url = u.scheme + "://127.0.0.1:" + std::to_string(d.proxy->port()) + u.prefix;
  return d;
}

}  // namespace tandem::net
