// A loopback TCP relay that adds network delay: every chunk of bytes is forwarded half a round
// trip after it arrived, in each direction, in order. It stands between a device and a cloud on
// one machine to emulate a WAN round trip (tandem eval --rtt-ms) without touching the kernel's
// network settings. Binds 127.0.0.1 only. Public (owned by src/net), for `tandem eval --rtt-ms`.
//
// With jitter, each chunk waits a further random 0..jitter_ms/2 in its direction (still in order
// within a connection): requests sent on two connections one after the other may then arrive in
// the other order, as on a real network.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace tandem::net {

class DelayProxy {
 public:
  // Relays 127.0.0.1:<port()> to target_host:target_port with `rtt_ms` added per round trip,
  // plus up to `jitter_ms` more.
  DelayProxy(const std::string& target_host, uint16_t target_port, double rtt_ms,
             double jitter_ms = 0);
  ~DelayProxy();
  DelayProxy(const DelayProxy&) = delete;
  DelayProxy& operator=(const DelayProxy&) = delete;

  uint16_t port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A DelayProxy in front of the HTTP(S) server at `url` (http[s]://host[:port][/prefix], host an
// IP address) and the URL that reaches that server through it: the same scheme and prefix on
// 127.0.0.1 and the proxy's port. Throws std::invalid_argument naming what is wrong with `url`
// (as parse_url), tandem::Error when the proxy cannot start.
struct DelayedUrl {
  std::unique_ptr<DelayProxy> proxy;
  std::string url;
};
DelayedUrl delay_url(const std::string& url, double rtt_ms);

}  // namespace tandem::net
