// The parts of an async_ps checkpoint (state/strategy.hpp) that both roles write alike; each role writes the
// rest of its local part beside the state it holds (worker.hpp, server.hpp).
//
// The options are the shared part (a stream saved under others is refused); the rest belongs to one rank
// and opens with the role that saved it, so a stream is never loaded into the other role. The server's
// state only moves inside finish(), so a consistent checkpoint of the whole group is taken after finish()
// on every rank: then every pushed gradient has been applied and every worker holds the final model.
// Loading those streams into fresh objects and calling start() again (the server hands its loaded model
// into params; workers pull it) continues where the run stopped: the same object would reach the same
// server state from the same deliveries in the same order. The same objects may also simply start() again
// after finish(); push counts and versions carry on.
#pragma once

#include <commsgd/error.hpp>
#include <commsgd/state/strategy.hpp>
#include <commsgd/sync/async_ps/log.hpp>
#include <commsgd/sync/async_ps/options.hpp>

#include <bit>
#include <cstdint>
#include <vector>

namespace commsgd::inline v1::sync {

namespace detail {

// One kind for both roles: async_ps<C> loads whichever role this rank has from the same frame.
inline constexpr const char* async_ps_state_kind = "sync::async_ps";

// What either role parses from a stream before committing it.
struct async_ps_saved {
  bool server = false;
  bool started = false;
  std::int64_t version = 0;
  std::uint64_t dim = 0;            // worker
  std::vector<float> model;         // server
  std::int64_t arrivals = 0;        // server
  std::vector<std::int64_t> pushes; // server: per worker, in rank order
  std::vector<applied_update> log;  // server
};

// The shared part: the options that decide the trajectory (tag_base and keep_log do not).
inline void save_async_ps_shared(state::writer& w, const async_ps_options& o) {
  w.put<float>(o.lr);
  w.put<std::int32_t>(o.server);
  w.put<std::int32_t>(o.apply_after);
  w.put<std::uint32_t>(o.staleness_scaling ? 1u : 0u);
  w.put<std::int32_t>(o.staleness_bound);
}
inline void parse_async_ps_shared(state::reader& r, const async_ps_options& o) {
  const float lr = r.get<float>();
  if (std::bit_cast<std::uint32_t>(lr) != std::bit_cast<std::uint32_t>(o.lr))
    throw corrupt_data(commsgd::concat("saved state: option 'lr' is ", lr, ", this one's is ", o.lr));
  state::expect_same(r.get<std::int32_t>(), o.server, "option 'server'");
  state::expect_same(r.get<std::int32_t>(), o.apply_after, "option 'apply_after'");
  state::expect_same(r.get<std::uint32_t>(), o.staleness_scaling ? 1u : 0u,
                     "option 'staleness_scaling' (1 on, 0 off)");
  state::expect_same(r.get<std::int32_t>(), o.staleness_bound, "option 'staleness_bound'");
}

// The start of the local part: which role saved it, and whether it had started.
inline void save_async_ps_role(state::writer& w, bool server, bool started) {
  w.put<std::uint32_t>(server ? 1u : 0u);
  w.put<std::uint32_t>(started ? 1u : 0u);
}
// Returns whether the saving role had started; `rank` is this rank, for the message.
inline bool parse_async_ps_role(state::reader& r, bool server, int rank) {
  const auto role = r.get<std::uint32_t>();
  if (role > 1)
    throw corrupt_data(commsgd::concat("saved state: role ", role, " is neither 0 (worker) nor 1 (server)"));
  if ((role == 1) != server)
    throw corrupt_data(commsgd::concat("saved state: saved by ",
                                       role == 1 ? "the parameter server" : "a worker", ", while rank ", rank,
                                       " is ", server ? "the server" : "a worker"));
  const auto started = r.get<std::uint32_t>();
  if (started > 1)
    throw corrupt_data(commsgd::concat("saved state: started = ", started, " is neither 0 nor 1"));
  return started == 1;
}

} // namespace detail

} // namespace commsgd::inline v1::sync
