// A loopback TCP relay that adds network delay: every chunk of bytes is forwarded half a round
// trip after it arrived, in each direction, in order. It stands between a device and a cloud on
// one machine to emulate a WAN round trip (tandem eval --rtt-ms) without touching the kernel's
// network settings. Binds 127.0.0.1 only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace tandem::net {

class DelayProxy {
 public:
  // Relays 127.0.0.1:<port()> to target_host:target_port with `rtt_ms` added per round trip.
  DelayProxy(const std::string& target_host, uint16_t target_port, double rtt_ms);
  ~DelayProxy();
  DelayProxy(const DelayProxy&) = delete;
  DelayProxy& operator=(const DelayProxy&) = delete;

  uint16_t port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::net
