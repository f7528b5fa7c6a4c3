// The JSON the tools, apps and command-line benchmarks print, on nlohmann/json: documents are
// built as ordered_json (keys in the order they are added, as documented) and laid out as the
// tools always have: one line per object, ", " and ": " between items, an array of objects one
// object per line. nlohmann/json writes every string and number. Not part of the library.
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace cadence::tools {

/// A JSON document whose objects keep their keys in insertion order.
using json = nlohmann::ordered_json;

/// `j` on one line: {"a": 1, "b": [1, 2]}. Strings and numbers as nlohmann/json writes them
/// (shortest round-trip numbers; NaN and infinities as null).
inline void append_json_line(std::string& out, const json& j) {
  if (j.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& item : j.items()) {
      if (!first) out += ", ";
      first = false;
      out += json(item.key()).dump();
      out += ": ";
      append_json_line(out, item.value());
    }
    out += '}';
  } else if (j.is_array()) {
    out += '[';
    for (std::size_t k = 0; k < j.size(); ++k) {
      if (k) out += ", ";
      append_json_line(out, j[k]);
    }
    out += ']';
  } else {
    out += j.dump(-1, ' ', false, json::error_handler_t::replace);
  }
}

inline std::string json_line(const json& j) {
  std::string out;
  append_json_line(out, j);
  return out;
}

/// An array with one element per line, ending with a newline:
///   [
///    {"policy": "bsp", ...},
///    {"policy": "asp", ...}
///   ]
/// ("[]" when empty); anything else on one line.
inline std::string json_document(const json& j) {
  if (!j.is_array() || j.empty()) return json_line(j) + "\n";
  std::string out = "[";
  for (std::size_t k = 0; k < j.size(); ++k) {
    out += k ? ",\n " : "\n ";
    append_json_line(out, j[k]);
  }
  return out + "\n]\n";
}

/// v to `digits` significant digits ("%.6g"), for numbers whose noise is not worth printing;
/// NaN and infinities stay (JSON null).
inline double significant(double v, int digits) {
  if (!std::isfinite(v)) return v;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return std::strtod(buf, nullptr);
}

/// v to `decimals` places after the point ("%.3f").
inline double decimals(double v, int places) {
  if (!std::isfinite(v)) return v;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", places, v);
  return std::strtod(buf, nullptr);
}

}  // namespace cadence::tools
