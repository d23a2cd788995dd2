// comm::traffic: the messages and bytes one rank sends and receives. comm::metered counts it, comm::simulated
// charges a rank's links with it, and the cost models in cost/ predict it, so a measurement and its model
// compare with ==.
#pragma once

#include <cstdint>

namespace commsgd::inline v1::comm {

struct traffic {
  std::uint64_t messages_sent = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t messages_received = 0;
  std::uint64_t bytes_received = 0;
  // Collective calls, where the one counting sees them (comm::metered); links and models leave it 0.
  std::uint64_t calls = 0;

  constexpr std::uint64_t bytes() const noexcept { return bytes_sent + bytes_received; }

  constexpr traffic& operator+=(const traffic& o) noexcept {
    messages_sent += o.messages_sent;
    bytes_sent += o.bytes_sent;
    messages_received += o.messages_received;
    bytes_received += o.bytes_received;
    calls += o.calls;
    return *this;
  }
  friend constexpr bool operator==(const traffic&, const traffic&) = default;
};

} // namespace commsgd::inline v1::comm
