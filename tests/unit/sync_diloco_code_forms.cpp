// The list of code forms in sync/diloco_codes.hpp, which the refusal and Python's COMPRESSIONS read, against what
// parse accepts: a form that parse refused, or a code parse takes that the list leaves out of the refusal,
// would send a user to a name that does not work.
#include <commsgd/sync/diloco_codes.hpp>

#include <doctest/doctest.h>

#include <iterator>
#include <string>
#include <string_view>

using namespace commsgd;

namespace {

// A form's name with its numbers filled in: its optional parts dropped, or all of them kept.
std::string instance(std::string_view form, bool optional_parts) {
  std::string out;
  for (std::size_t i = 0; i < form.size(); ++i) {
    if (form[i] == '[' || form[i] == ']') {
      if (!optional_parts && form[i] == '[') i = form.find(']', i);
      continue;
    }
    if (form[i] == '<') {
      const auto end = form.find('>', i);
      const auto what = form.substr(i + 1, end - i - 1);
      out += what == "density" ? "0.25" : what == "chunk" ? "64" : what == "fit" ? "20" : "0.5";
      i = end;
      continue;
    }
    out += form[i];
  }
  return out;
}

} // namespace

TEST_CASE("every listed form parses, bare and with all its parts, and writes its name back alike") {
  const auto forms = sync::diloco_code_forms();
  REQUIRE(forms.size() == std::size(sync::diloco_words) + std::size(sync::diloco_top_k_forms));
  for (const auto form : forms) {
    for (bool full : {false, true}) {
      const auto name = instance(form, full);
      CAPTURE(name);
      CHECK(sync::diloco_code::parse(name).name() == name);
    }
  }
  CHECK(instance(forms.back(), true) == "topk-0.25-c64-b0.5-fit20");
  for (const auto& w : sync::diloco_words)
    CHECK(sync::diloco_code::parse(w.name).format == w.format);
}

TEST_CASE("a refusal names every form and the ranges of their numbers") {
  const auto allowed = sync::diloco_codes_allowed();
  for (const auto form : sync::diloco_code_forms())
    CHECK(allowed.find(std::string("'") + std::string(form) + "'") != std::string::npos);
  CHECK(allowed.find(std::string(sync::diloco_top_k_ranges)) != std::string::npos);
  CHECK(allowed.starts_with("'dense', 'fp16', "));
  const std::string refusal =
      "argument 'compression' = 'fp4' is not a code; the allowed codes are " + allowed;
  CHECK_THROWS_WITH_AS(sync::diloco_code::parse("fp4"), doctest::Contains(refusal.c_str()), invalid_argument);
}
