#include "client/pipeline_ledger.h"

#include <iterator>
#include <utility>

namespace tandem {

const PipelineLedger::Flight& PipelineLedger::send(Flight flight) {
  flights_.push_back(std::move(flight));
  return flights_.back();
}

PipelineLedger::Flight PipelineLedger::take_earliest() {
  Flight f = std::move(flights_.front());
  flights_.pop_front();
  return f;
}

std::vector<PipelineLedger::Held> PipelineLedger::take_settled() {
  // A held token's history_len is the history length right after it: the next consultation,
  // sent at history length p, held every token with history_len > p.
  const size_t upto = flights_.empty() ? SIZE_MAX : flights_.front().pos;
  size_t n = 0;
  while (n < held_.size() && held_[n].history_len <= upto) ++n;
  const auto end = held_.begin() + static_cast<std::ptrdiff_t>(n);
  std::vector<Held> settled(std::make_move_iterator(held_.begin()), std::make_move_iterator(end));
  held_.erase(held_.begin(), end);
  return settled;
}

std::optional<StopReason> PipelineLedger::take_settled_stop() {
  if (!flights_.empty()) return std::nullopt;
  return std::exchange(held_stop_, std::nullopt);
}

std::vector<uint64_t> PipelineLedger::drop_all() {
  std::vector<uint64_t> tickets;
  for (const Flight& f : flights_) tickets.push_back(f.ticket);
  flights_.clear();
  held_.clear();
  held_stop_.reset();
  return tickets;
}

}  // namespace tandem
