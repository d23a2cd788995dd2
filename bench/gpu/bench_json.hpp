// The JSON file every GPU benchmark writes: its run's settings, one per line, then "results", one object per
// row on a line of its own (bench/gpu/report*.py read them by key). A row's numbers keep the precision each
// benchmark asks for, so the files stay as comparable from run to run as they were.
#pragma once

#include <concepts>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace bench {

inline std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

// One JSON object's fields in the order added.
class json_object {
public:
  json_object& add(const char* key, const std::string& s) { return put(key, "\"" + json_escape(s) + "\""); }
  json_object& add(const char* key, const char* s) { return add(key, std::string(s)); }
  json_object& add(const char* key, bool b) { return put(key, b ? "true" : "false"); }
  template <std::integral I>
  json_object& add(const char* key, I v) {
    return put(key, std::to_string(v));
  }
  // A number printed with `format` (a printf conversion of one double: "%g", "%.6f").
  json_object& add(const char* key, double v, const char* format) { return put(key, printed(v, format)); }
  json_object& add(const char* key, double v) = delete; // a number says its precision
  json_object& add(const char* key, const std::vector<double>& v, const char* format) {
    std::string list = "[";
    for (std::size_t j = 0; j < v.size(); ++j)
      list += (j ? ", " : "") + printed(v[j], format);
    return put(key, list + "]");
  }

  // The fields joined by `separator`, without braces.
  std::string joined(const char* separator) const {
    std::string s;
    for (std::size_t i = 0; i < fields_.size(); ++i)
      s += (i ? separator : "") + fields_[i];
    return s;
  }

private:
  static std::string printed(double v, const char* format) {
    char buf[64];
    std::snprintf(buf, sizeof buf, format, v);
    return buf;
  }
  json_object& put(const char* key, const std::string& value) {
    fields_.push_back("\"" + std::string(key) + "\": " + value);
    return *this;
  }
  std::vector<std::string> fields_;
};

// Writes `settings` and `results` to `path`; false when the file cannot be written.
inline bool write_results(const std::string& path, const json_object& settings,
                          const std::vector<json_object>& results) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  std::fprintf(f, "{\n  %s,\n  \"results\": [\n", settings.joined(",\n  ").c_str());
  for (std::size_t i = 0; i < results.size(); ++i)
    std::fprintf(f, "    {%s}%s\n", results[i].joined(", ").c_str(), i + 1 < results.size() ? "," : "");
  std::fprintf(f, "  ]\n}\n");
  return std::fclose(f) == 0;
}

} // namespace bench
