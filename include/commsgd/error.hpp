// The exception types every commsgd entry point throws (design section 4).
#pragma once

#include <commsgd/config.hpp>

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace commsgd::inline v1 {

// Base of everything commsgd throws: catch this to catch them all.
class error : public std::runtime_error {
public:
  explicit error(const std::string& what) : std::runtime_error("commsgd: " + what) {}
};

// An argument outside its allowed range; the message names the argument, its value and the range.
class invalid_argument : public error {
public:
  using error::error;
};

// Buffers whose sizes disagree, on one rank or across ranks.
class size_mismatch : public invalid_argument {
public:
  using invalid_argument::invalid_argument;
};

// NaN or infinity in data that must be finite; carries how many and where the first one is.
class non_finite : public error {
public:
  non_finite(std::string_view what_data, std::size_t count, std::size_t first_index)
      : error(std::string(what_data) + " holds " + std::to_string(count) +
              " non-finite value(s) (NaN or inf), the first at index " + std::to_string(first_index)),
        count_(count), first_index_(first_index) {}
  std::size_t count() const noexcept { return count_; }
  std::size_t first_index() const noexcept { return first_index_; }

private:
  std::size_t count_;
  std::size_t first_index_;
};

// A packet or saved state that is truncated, of the wrong kind, or fails a consistency check.
class corrupt_data : public error {
public:
  using error::error;
};

// A communicator failed (a peer left, MPI returned an error, a message had the wrong size).
class comm_error : public error {
public:
  using error::error;
};

// Another rank of the same group failed, so this rank's pending call can never complete.
class comm_aborted : public comm_error {
public:
  using comm_error::comm_error;
};

// A method cannot reach its contract on this input (for instance too many ties at a threshold).
class unsupported : public error {
public:
  using error::error;
};

// A fault of commsgd itself: a state its own logic should never reach (never the user's input). Worth a
// report with the input that caused it.
class internal_error : public error {
public:
  explicit internal_error(const std::string& what) : error("internal error: " + what) {}
};

// Every part of commsgd words its errors with these two, and a policy of your own may too, so that its
// messages read like the built-in ones.

// The parts streamed one after another, numbers at full double precision (17 digits), so that a value in a
// message is the value that was checked.
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  out.precision(17);
  (out << ... << parts);
  return out.str();
}

// Throws invalid_argument unless lo <= value <= hi; `range` is how the range reads to a user,
// e.g. "[1, n = 4]".
template <class T, class U, class V>
void check_range(std::string_view name, const T& value, const U& lo, const V& hi, std::string_view range) {
  if (!(value >= lo && value <= hi))
    throw invalid_argument(
        concat("argument '", name, "' = ", value, " is outside the allowed range ", range));
}

} // namespace commsgd::inline v1
