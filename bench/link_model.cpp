// link_model: measured collectives of comm::mpi beside what the cost model predicts for them, to check the
// model on real links (tools/netcluster shapes them). Not a Google Benchmark: every rank must time the same
// operation between barriers, and the figure of an operation is its slowest rank's time.
//
//   mpirun -n 4 link_model --rate 100mbit [--sizes 1k,64k,1m,16m,64m] [--seconds 2] [--latency 50e-6]
//   link_model --predict --ranks 4 --rate 100mbit      # the model alone, for gloo's figures (netcluster/collectives.py)
//
// S is each rank's input in wire bytes: all_reduce sums S/4 floats (MPI_Allreduce), all_gather collects S
// bytes from every rank (MPI_Allgather), ring16 sums S/2 values sent as fp16 (comm::narrow_ring_sum). The
// model charges each rank comm::load's traffic of the operation on comm::network_model; `model_nominal` takes
// the link rate as payload, `model_tcp` takes what TCP carries of it (network_model::tcp_link), `model_half`
// is model_tcp with duplex::half (one direction at a time: what Open MPI's default TCP protocol gives a
// pairwise exchange; bench/results/model-check-2026-11-25.md).
// Prints CSV: op,ranks,bytes,reps,measured_s,model_nominal_s,model_tcp_s,model_half_s.
#include <commsgd/comm/mpi.hpp>
#include <commsgd/comm/narrow_ring.hpp>
#include <commsgd/comm/simulated.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/error.hpp>

#include <boost/mpi/environment.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace commsgd;

// "100mbit", "1gbit", "10gbit", "125000000" (bits per second).
double parse_rate(std::string_view s) {
  const auto digits = s.find_first_not_of("0123456789.");
  const double v = std::strtod(std::string(s.substr(0, digits)).c_str(), nullptr);
  const std::string_view unit = digits == std::string_view::npos ? "" : s.substr(digits);
  double scale = 0;
  if (unit.empty() || unit == "bit")
    scale = 1;
  else if (unit == "kbit")
    scale = 1e3;
  else if (unit == "mbit")
    scale = 1e6;
  else if (unit == "gbit")
    scale = 1e9;
  if (!(scale > 0) || !(v > 0))
    throw invalid_argument(commsgd::concat("link_model: '--rate' = '", s,
                                          "' is not a rate; expected a number with kbit, mbit or gbit"));
  return v * scale;
}

std::uint64_t parse_size(std::string_view s) {
  const char last = s.empty() ? '\0' : s.back();
  std::uint64_t scale = 1;
  if (last == 'k') scale = 1024;
  if (last == 'm') scale = 1024 * 1024;
  const auto digits = scale == 1 ? s : s.substr(0, s.size() - 1);
  const auto v = std::strtoull(std::string(digits).c_str(), nullptr, 10);
  if (v == 0 || digits.find_first_not_of("0123456789") != std::string_view::npos)
    throw invalid_argument(
        commsgd::concat("link_model: size '", s, "' is not a size; expected e.g. 1k, 64k, 16m"));
  return v * scale;
}

std::vector<std::uint64_t> parse_sizes(std::string_view list) {
  std::vector<std::uint64_t> out;
  while (!list.empty()) {
    const auto comma = list.find(',');
    out.push_back(parse_size(list.substr(0, comma)));
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
  }
  return out;
}

struct options {
  double rate_bits = 1e9;
  double latency_s = 50e-6;
  double seconds = 2;
  int ranks = 0; // --predict only
  bool predict = false;
  std::vector<std::uint64_t> sizes = parse_sizes("1k,16k,256k,1m,4m,16m,64m");
  std::vector<std::string> ops = {"all_reduce", "all_gather", "ring16"};
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) throw invalid_argument(commsgd::concat("link_model: '", a, "' needs a value"));
      return argv[++i];
    };
    if (a == "--rate")
      o.rate_bits = parse_rate(value());
    else if (a == "--latency")
      o.latency_s = std::strtod(std::string(value()).c_str(), nullptr);
    else if (a == "--seconds")
      o.seconds = std::strtod(std::string(value()).c_str(), nullptr);
    else if (a == "--sizes")
      o.sizes = parse_sizes(value());
    else if (a == "--ranks")
      o.ranks = std::atoi(std::string(value()).c_str());
    else if (a == "--predict")
      o.predict = true;
    else if (a == "--ops") {
      o.ops.clear();
      std::string_view list = value();
      while (!list.empty()) {
        const auto comma = list.find(',');
        o.ops.emplace_back(list.substr(0, comma));
        list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
      }
    } else
      throw invalid_argument(commsgd::concat("link_model: unknown argument '", a, "'"));
  }
  for (const auto& op : o.ops)
    if (op != "all_reduce" && op != "all_gather" && op != "ring16")
      throw invalid_argument(
          commsgd::concat("link_model: '--ops' has '", op, "'; allowed: all_reduce, all_gather, ring16"));
  if (!(o.latency_s >= 0))
    throw invalid_argument(commsgd::concat("link_model: '--latency' = ", o.latency_s, " is outside [0, inf)"));
  if (!(o.seconds > 0))
    throw invalid_argument(commsgd::concat("link_model: '--seconds' = ", o.seconds, " is outside (0, inf)"));
  return o;
}

// The slowest rank's traffic time of one operation under the model.
double model_seconds(const std::string& op, std::uint64_t bytes, int n, const comm::network_model& net) {
  double worst = 0;
  for (int rank = 0; rank < n; ++rank) {
    comm::traffic l;
    if (op == "all_reduce")
      l = comm::load::all_reduce(bytes / 4, 4, n, rank);
    else if (op == "all_gather")
      l = comm::load::all_gather(bytes, n, comm::medium::switched);
    else
      l = comm::load::all_reduce(bytes / 2, 2, n, rank);
    worst = std::max(worst, comm::busy_seconds(l, net));
  }
  return worst;
}

void print_row(const std::string& op, int n, std::uint64_t bytes, int reps, double measured,
               const options& o) {
  const comm::network_model nominal{o.latency_s, o.rate_bits / 8};
  const auto tcp = comm::network_model::tcp_link(o.rate_bits, o.latency_s);
  auto half = tcp;
  half.duplex = comm::duplex::half;
  std::printf("%s,%d,%llu,%d,%.6g,%.6g,%.6g,%.6g\n", op.c_str(), n, static_cast<unsigned long long>(bytes),
              reps, measured, model_seconds(op, bytes, n, nominal), model_seconds(op, bytes, n, tcp),
              model_seconds(op, bytes, n, half));
  std::fflush(stdout);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void measure(comm::mpi& c, const options& o) {
  const int n = c.size();
  comm::narrow_ring_buffers ring_buf;
  for (const auto& op : o.ops)
    for (const auto bytes : o.sizes) {
      std::vector<float> x(op == "ring16" ? bytes / 2 : op == "all_reduce" ? bytes / 4 : 0, 0.0f);
      std::vector<std::byte> mine(op == "all_gather" ? bytes : 0), all(op == "all_gather" ? bytes * n : 0);
      auto once = [&] {
        if (op == "all_reduce")
          c.all_reduce_sum(std::span<float>(x));
        else if (op == "all_gather")
          c.all_gather(std::span<const std::byte>(mine), std::span<std::byte>(all));
        else
          comm::narrow_ring_sum<compress::fp16_format>(c, std::span<float>(x), false, ring_buf);
      };
      // A first call pays connection set-up; then as many as fill --seconds, by the model's own estimate
      // corrected by the first measurement.
      c.barrier();
      auto t0 = std::chrono::steady_clock::now();
      once();
      double first = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      c.all_reduce_sum(std::span<double>(&first, 1));
      first /= n;
      const int reps = std::clamp(static_cast<int>(o.seconds / std::max(first, 1e-6)), 3, 200);
      std::vector<double> times;
      for (int r = 0; r < reps; ++r) {
        c.barrier();
        t0 = std::chrono::steady_clock::now();
        once();
        double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        // The slowest rank's time: the operation is done when every rank is.
        std::vector<double> each(static_cast<std::size_t>(n));
        c.all_gather(std::span<const double>(&dt, 1), std::span<double>(each));
        times.push_back(*std::max_element(each.begin(), each.end()));
      }
      if (c.rank() == 0) print_row(op, n, bytes, reps, median(times), o);
    }
}

} // namespace

int main(int argc, char** argv) {
  try {
    const auto o = parse(argc, argv);
    if (o.predict) {
      if (o.ranks < 2)
        throw invalid_argument(commsgd::concat("link_model: '--ranks' = ", o.ranks, " is outside [2, inf)"));
      std::printf("op,ranks,bytes,reps,measured_s,model_nominal_s,model_tcp_s,model_half_s\n");
      for (const auto& op : o.ops)
        for (const auto bytes : o.sizes)
          print_row(op, o.ranks, bytes, 0, 0, o);
      return 0;
    }
    boost::mpi::environment env(argc, argv);
    auto c = comm::mpi::world();
    if (c.rank() == 0) std::printf("op,ranks,bytes,reps,measured_s,model_nominal_s,model_tcp_s,model_half_s\n");
    measure(c, o);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
}
